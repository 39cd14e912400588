-- wrk script for bench/request_cost.sh: streaming OpenAI chat requests, each prompt its own (no
-- cache hit, no prefix shared beyond the template), 2 output tokens: what a request costs each
-- service beyond its tokens (MAX_TOKENS=N in the environment: N tokens, for what a token costs).
wrk.method = "POST"
local max_tokens = os.getenv("MAX_TOKENS") or "2"
wrk.headers["Content-Type"] = "application/json"
local n = 0
request = function()
  n = n + 1
  local body = '{"model":"meshserve-tiny","messages":[{"role":"user","content":"question ' .. n ..
    ' of the cost probe: how far is the nearest city from the coast, in kilometres, and why?"}],' ..
    '"max_completion_tokens":' .. max_tokens .. ',"ignore_eos":true,"stream":true,"stream_options":{"include_usage":true}}'
  return wrk.format(nil, "/v1/chat/completions", nil, body)
end
