-- tollgate: shared helpers. Every number handled here is an integer below 2^53, where Lua's
-- doubles are exact; integer division goes through idiv/cdiv, which correct the rounding of `/`.
local floor = math.floor
local fmt = string.format
local MAX_EXACT = 9007199254740992 -- 2^53

-- floor(a / b) for integers a >= 0, b > 0 below 2^53.
local function idiv(a, b)
  local q = floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

-- ceil(a / b) for integers a >= 0, b > 0 below 2^53.
local function cdiv(a, b)
  local q = idiv(a, b)
  if q * b < a then
    q = q + 1
  end
  return q
end

-- Patterns for a string holding 1 to 4 colon-separated non-negative integers.
local PATTERNS = {
  '^(%d+)$',
  '^(%d+):(%d+)$',
  '^(%d+):(%d+):(%d+)$',
  '^(%d+):(%d+):(%d+):(%d+)$',
}

-- Reads a string key holding `n` colon-separated integers below 2^53. Returns them as a table
-- (nil when the key is missing) and whether the key held anything else (another type, garbage,
-- out-of-range numbers): such a key is deleted and treated as fresh, and the caller reports it.
local function load_ints(key, n)
  local v = redis.pcall('GET', key)
  if v == false then
    return nil, false
  end
  if type(v) == 'string' and #v <= 80 then
    local caps = { string.match(v, PATTERNS[n]) }
    if #caps == n then
      local ok = true
      for i = 1, n do
        local x = tonumber(caps[i])
        if x == nil or x >= MAX_EXACT then
          ok = false
        end
        caps[i] = x
      end
      if ok then
        return caps, false
      end
    end
  end
  redis.call('DEL', key)
  return nil, true
end

-- Writes `n` integers as one colon-separated string with an expiry in milliseconds.
local function store_ints(key, ttl, a, b, c, d)
  local v
  if b == nil then
    v = fmt('%d', a)
  elseif c == nil then
    v = fmt('%d:%d', a, b)
  elseif d == nil then
    v = fmt('%d:%d:%d', a, b, c)
  else
    v = fmt('%d:%d:%d:%d', a, b, c, d)
  end
  redis.call('SET', key, v, 'PX', ttl)
end
