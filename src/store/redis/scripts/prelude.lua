-- tollgate: shared helpers. Every number handled here is an integer below 2^53, where Lua's
-- doubles are exact; integer division goes through idiv/cdiv, which correct the rounding of `/`.
local floor = math.floor
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

-- Small integer arguments ('0', '1', ...) without strtod, which dominates the cost of tonumber.
local function int(s)
  if s == '1' then
    return 1
  elseif s == '0' then
    return 0
  end
  return tonumber(s)
end

-- State is stored as little-endian 64-bit integers (struct 'i8'): no decimal conversion on
-- the hot path, and every value an exact integer.
local function unpack_ints(n, v)
  if n == 1 then
    return { (struct.unpack('<i8', v)) }
  elseif n == 2 then
    local a, b = struct.unpack('<i8i8', v)
    return { a, b }
  end
  local a, b, c = struct.unpack('<i8i8i8', v)
  return { a, b, c }
end

-- Reads a key holding `n` integers. Returns them as a table (nil when the key is missing) and
-- whether the key held anything else (another type, another length, a value outside
-- [0, 2^53)): such a key is deleted and treated as fresh, and the caller reports it.
local function load_ints(key, n)
  local v = redis.pcall('GET', key)
  if v == false then
    return nil, false
  end
  if type(v) == 'string' and #v == 8 * n then
    local st = unpack_ints(n, v)
    local ok = true
    for i = 1, n do
      local x = st[i]
      if x < 0 or x >= MAX_EXACT then
        ok = false
      end
    end
    if ok then
      return st, false
    end
  end
  redis.call('DEL', key)
  return nil, true
end

-- Writes up to 3 integers with an expiry in milliseconds.
local function store_ints(key, ttl, a, b, c)
  local v
  if b == nil then
    v = struct.pack('<i8', a)
  elseif c == nil then
    v = struct.pack('<i8i8', a, b)
  else
    v = struct.pack('<i8i8i8', a, b, c)
  end
  redis.call('SET', key, v, 'PX', ttl)
end
