-- The HTTP/JSON side of the edge, in front of the gRPC-JSON transcoder:
-- 1. Rejects JSON request bodies that carry fields the gRPC request message does not define.
--    Envoy's transcoder drops unknown fields silently; a client that misspells "max_tokens"
--    would get a default it never asked for. SCHEMAS maps each HTTP path to the allowed keys
--    per JSON path. Malformed JSON is left to the transcoder, which answers 400 itself.
-- 2. Steers `"stream": true` bodies to the streaming twin of the path (STREAM_PATHS): the
--    transcoder chooses the gRPC method from the path alone; or, with the gateways' HTTP edges
--    on, to the edge's path (EDGE_PATHS), which the transcoder passes through.
-- 3. Marks the request's API (API_HEADER: "openai" or "json") so Envoy's own error replies get
--    that API's shape (local_reply_config), and reshapes gRPC errors on OpenAI paths into
--    OpenAI's {"error": {...}} body.
-- The scan is bounded: a body larger than MAX_BODY_BYTES is refused (413), JSON nested deeper than
-- MAX_JSON_DEPTH (400); and it fails closed: an error in this script refuses the request (500),
-- which Envoy would otherwise pass on unchecked.
-- SCHEMAS, STREAM_PATHS, OPENAI_ROOT (OpenAI paths outside /v1/), NATIVE_PREFIX, API_HEADER,
-- PARAM_HEADER, EDGE_PATHS (where streams go when the gateways' HTTP edges are on),
-- MAX_BODY_BYTES and MAX_JSON_DEPTH are prepended by deploy/envoy_config.py.

local function skip_ws(s, i)
  return s:find("[^ \t\r\n]", i) or #s + 1
end

local function parse_string(s, i)
  local j, parts = i + 1, {}
  while true do
    local k = s:find('["\\]', j)
    if not k then return nil end
    parts[#parts + 1] = s:sub(j, k - 1)
    if s:sub(k, k) == '"' then return table.concat(parts), k + 1 end
    parts[#parts + 1] = s:sub(k, k + 1) -- keep escapes verbatim: such a key is unknown anyway
    j = k + 2
  end
end

local parse_value

local function parse_object(s, i, path, schema, bad, depth)
  i = skip_ws(s, i + 1)
  if s:sub(i, i) == "}" then return i + 1 end
  local allowed = schema[path]
  while true do
    if s:sub(i, i) ~= '"' then return nil end
    local key
    key, i = parse_string(s, i)
    if not key then return nil end
    local child = (path == "" and key) or (path .. "." .. key)
    if allowed and not allowed[key] and not bad[1] then bad[1] = child end
    i = skip_ws(s, i)
    if s:sub(i, i) ~= ":" then return nil end
    local start = skip_ws(s, i + 1)
    i = parse_value(s, start, child, schema, bad, depth)
    if not i then return nil end
    if child == "stream" then bad.stream = s:sub(start, i - 1) end
    i = skip_ws(s, i)
    local c = s:sub(i, i)
    if c == "}" then return i + 1 end
    if c ~= "," then return nil end
    i = skip_ws(s, i + 1)
  end
end

local function parse_array(s, i, path, schema, bad, depth)
  i = skip_ws(s, i + 1)
  if s:sub(i, i) == "]" then return i + 1 end
  while true do
    i = parse_value(s, i, path .. "[]", schema, bad, depth)
    if not i then return nil end
    i = skip_ws(s, i)
    local c = s:sub(i, i)
    if c == "]" then return i + 1 end
    if c ~= "," then return nil end
    i = skip_ws(s, i + 1)
  end
end

-- The index after the JSON value at i (nil: not JSON, or nested past MAX_JSON_DEPTH, which sets
-- bad.deep); depth: the objects and arrays around it.
parse_value = function(s, i, path, schema, bad, depth)
  local c = s:sub(i, i)
  if c == "{" or c == "[" then
    if depth >= MAX_JSON_DEPTH then
      bad.deep = true
      return nil
    end
    if c == "{" then return parse_object(s, i, path, schema, bad, depth + 1) end
    return parse_array(s, i, path, schema, bad, depth + 1)
  end
  if c == '"' then
    local _, j = parse_string(s, i)
    return j
  end
  local j = s:find("[,%]} \t\r\n]", i) or #s + 1 -- a number, true, false or null
  if j == i then return nil end
  return j
end

local function json_escape(s)
  return (s:gsub('[%c"\\]', function(c) return string.format("\\u%04x", c:byte()) end))
end

local function is_openai(path)
  return OPENAI_ROOT[path] or (path:sub(1, 4) == "/v1/" and path:sub(1, #NATIVE_PREFIX) ~= NATIVE_PREFIX)
end

-- A refusal that local_reply_config shapes per API (it has a mapper for the status).
local function reply(handle, status, message)
  handle:respond({ [":status"] = tostring(status), ["content-type"] = "text/plain" }, message)
end

-- A 400 for a request body, in the API's error shape.
local function refuse(handle, openai, message)
  if openai then -- local_reply_config wraps it in OpenAI's error shape
    handle:respond({ [":status"] = "400", ["content-type"] = "text/plain" }, message)
  else
    handle:respond(
      { [":status"] = "400", ["content-type"] = "application/json" },
      '{"code":3,"message":"' .. message .. '","details":[]}'
    )
  end
end

local function on_request(handle)
  local headers = handle:headers()
  local path = (headers:get(":path") or ""):gsub("%?.*", "")
  local ctype = headers:get("content-type") or ""
  if ctype:find("^application/grpc") or (path:sub(1, 4) ~= "/v1/" and not OPENAI_ROOT[path]) then return end
  local openai = is_openai(path)
  headers:replace(API_HEADER, openai and "openai" or "json")
  if openai then handle:streamInfo():dynamicMetadata():set("meshserve", "openai", "1") end
  local schema = SCHEMAS[path]
  -- Any content type but gRPC: the transcoder reads every body as JSON (curl -d sends
  -- application/x-www-form-urlencoded), so the same bodies are checked and steered here.
  if not schema then return end
  local method = headers:get(":method") or ""
  if method ~= "POST" then -- these paths take a JSON body: a 405 that says so, not "no route" (404)
    if method == "OPTIONS" then return end -- a CORS preflight is Envoy's (or nobody's) to answer
    handle:respond({ [":status"] = "405", ["allow"] = "POST", ["content-type"] = "text/plain" },
      "method " .. json_escape(method) .. " is not allowed on " .. json_escape(path) .. ": use POST with a JSON body")
    return
  end
  local body = handle:body()
  if not body or body:length() == 0 then return end
  if body:length() > MAX_BODY_BYTES then -- the listener's buffer limit refuses it first
    reply(handle, 413, "request body larger than " .. MAX_BODY_BYTES .. " bytes")
    return
  end
  local s = body:getBytes(0, body:length())
  local bad = {}
  local i = parse_value(s, skip_ws(s, 1), "", schema, bad, 0)
  if bad.deep then
    refuse(handle, openai, "the request body nests JSON deeper than " .. MAX_JSON_DEPTH .. " levels")
    return
  end
  if i and bad[1] then
    refuse(handle, openai, "unknown field '" .. json_escape(bad[1]) .. "' in the request body")
    return
  end
  -- Only a JSON boolean (or null) chooses the method: a string "true" would otherwise reach the
  -- unary method and answer in one piece a client that asked for a stream.
  local stream = bad.stream
  if i and stream and stream ~= "true" and stream ~= "false" and stream ~= "null" and STREAM_PATHS[path] then
    local kinds = { ['"'] = "a string", ["["] = "an array", ["{"] = "an object" }
    refuse(handle, openai, "'stream' must be true or false (a JSON boolean), got " .. (kinds[stream:sub(1, 1)] or "a number"))
    return
  end
  if i and stream == "true" and STREAM_PATHS[path] then
    -- With the gateways' HTTP edges on, to the edge's path (untranscoded, a route of its own).
    local edge = EDGE_PATHS[path]
    handle:headers():replace(":path", edge or STREAM_PATHS[path]) -- headers() again: body() may have yielded
    if edge then handle:clearRouteCache() end
  end
end

function envoy_on_request(handle)
  local ok, err = pcall(on_request, handle)
  if not ok then -- Envoy would pass the request on unchecked: refuse it instead
    handle:logErr("meshserve request check failed: " .. tostring(err))
    reply(handle, 500, "the edge could not check this request; it was not served")
  end
end

-- ERROR_TYPES (gRPC status code -> OpenAI error type and code) is rendered from
-- services/openai_errors.py by deploy/envoy_config.py, as SCHEMAS is.

-- The raw (still JSON-escaped) string value of `key` in a flat JSON object, or nil.
local function raw_string(s, key)
  local _, j = s:find('"' .. key .. '"%s*:%s*"')
  if not j then return nil end
  local k = j + 1
  while true do
    local q = s:find('["\\]', k)
    if not q then return nil end
    if s:sub(q, q) == '"' then return s:sub(j + 1, q - 1) end
    k = q + 2
  end
end

local function on_response(handle)
  local meta = handle:streamInfo():dynamicMetadata():get("meshserve")
  if not meta or meta["openai"] ~= "1" then return end
  local headers = handle:headers()
  local status = tonumber(headers:get(":status") or "200")
  if status < 400 or not (headers:get("content-type") or ""):find("json") then return end
  local body = handle:body()
  if not body or body:length() == 0 then return end
  local s = body:getBytes(0, body:length())
  -- The transcoder's {"code": N, "message": "...", "details": []} for a gRPC error; Envoy's own
  -- replies are already OpenAI-shaped by local_reply_config.
  local code = tonumber(s:match('^%s*{%s*"code"%s*:%s*(%d+)'))
  if not code then return end
  local message = raw_string(s, "message") or ""
  local kind = ERROR_TYPES[code] or { "server_error", "internal" }
  -- The field at fault, as the service named it (trailing metadata of the status; a trailers-only
  -- gRPC answer brings it with the headers).
  local param = handle:headers():get(PARAM_HEADER) -- again: body() may have yielded
  if param and not param:match("^[%w_%.%[%]]+$") then param = nil end
  local out = '{"error":{"message":"' .. message .. '","type":"' .. kind[1] .. '","param":'
    .. (param and ('"' .. param .. '"') or "null") .. ',"code":"' .. kind[2] .. '"}}'
  body:setBytes(out)
  headers = handle:headers() -- again: body() may have yielded
  headers:remove("grpc-status")
  headers:remove("grpc-message")
  headers:remove(PARAM_HEADER)
  if code == 8 and not headers:get("retry-after") then headers:replace("retry-after", "1") end
end

function envoy_on_response(handle)
  local ok, err = pcall(on_response, handle)
  if not ok then -- the error answer goes on in the gateway's shape: logged, not hidden
    handle:logErr("meshserve error reshaping failed: " .. tostring(err))
  end
end
