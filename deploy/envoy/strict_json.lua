-- Rejects JSON request bodies that carry fields the gRPC request message does not define.
-- Envoy's gRPC-JSON transcoder drops unknown fields silently; a client that misspells
-- "max_tokens" would get a default it never asked for. SCHEMAS (prepended by deploy/envoy.py
-- from the proto descriptor) maps each HTTP path to the allowed keys per JSON path.
-- Malformed JSON is left to the transcoder, which answers 400 itself.

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

local function parse_object(s, i, path, schema, bad)
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
    i = parse_value(s, skip_ws(s, i + 1), child, schema, bad)
    if not i then return nil end
    i = skip_ws(s, i)
    local c = s:sub(i, i)
    if c == "}" then return i + 1 end
    if c ~= "," then return nil end
    i = skip_ws(s, i + 1)
  end
end

local function parse_array(s, i, path, schema, bad)
  i = skip_ws(s, i + 1)
  if s:sub(i, i) == "]" then return i + 1 end
  while true do
    i = parse_value(s, i, path .. "[]", schema, bad)
    if not i then return nil end
    i = skip_ws(s, i)
    local c = s:sub(i, i)
    if c == "]" then return i + 1 end
    if c ~= "," then return nil end
    i = skip_ws(s, i + 1)
  end
end

parse_value = function(s, i, path, schema, bad)
  local c = s:sub(i, i)
  if c == "{" then return parse_object(s, i, path, schema, bad) end
  if c == "[" then return parse_array(s, i, path, schema, bad) end
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

function envoy_on_request(handle)
  local headers = handle:headers()
  local schema = SCHEMAS[(headers:get(":path") or ""):gsub("%?.*", "")]
  local ctype = headers:get("content-type") or ""
  if not schema or headers:get(":method") ~= "POST" or not ctype:find("json") then return end
  local body = handle:body()
  if not body or body:length() == 0 then return end
  local s = body:getBytes(0, body:length())
  local bad = {}
  local i = parse_value(s, skip_ws(s, 1), "", schema, bad)
  if i and bad[1] then
    local message = "unknown field '" .. json_escape(bad[1]) .. "' in the request body"
    handle:respond(
      { [":status"] = "400", ["content-type"] = "application/json" },
      '{"code":3,"message":"' .. message .. '","details":[]}'
    )
  end
end
