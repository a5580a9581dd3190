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
-- the hot path, and every value an exact integer. Loaders return `corrupt` first, then the
-- state's integers (zeros for a missing key, which is a fresh key).

-- The value at `key` if it is a string of `len` bytes (any positive multiple of 16 when `len`
-- is 0); false if the key is missing; nil, after deleting the key, if it holds anything else.
local function read_state(key, len)
  local v = redis.pcall('GET', key)
  if v == false then
    return false
  end
  if type(v) == 'string' and (#v == len or (len == 0 and #v > 0 and #v % 16 == 0)) then
    return v
  end
  redis.call('DEL', key)
  return nil
end

local function out_of_range(x)
  return x < 0 or x >= MAX_EXACT
end

-- Deletes a key whose integers are out of range; returns true (corrupt) and zeros.
local function reset_state(key)
  redis.call('DEL', key)
  return true, 0, 0, 0
end

local function load1(key)
  local v = read_state(key, 8)
  if not v then
    return v == nil, 0
  end
  local a = struct.unpack('<i8', v)
  if a < 0 or a >= MAX_EXACT then
    return reset_state(key)
  end
  return false, a
end

local function load2(key)
  local v = read_state(key, 16)
  if not v then
    return v == nil, 0, 0
  end
  local a, b = struct.unpack('<i8i8', v)
  if a < 0 or a >= MAX_EXACT or b < 0 or b >= MAX_EXACT then
    return reset_state(key)
  end
  return false, a, b
end

local function load3(key)
  local v = read_state(key, 24)
  if not v then
    return v == nil, 0, 0, 0
  end
  local a, b, c = struct.unpack('<i8i8i8', v)
  if out_of_range(a) or out_of_range(b) or out_of_range(c) then
    return reset_state(key)
  end
  return false, a, b, c
end

local function store1(key, ttl, a)
  redis.call('SET', key, struct.pack('<i8', a), 'PX', ttl)
end

local function store2(key, ttl, a, b)
  redis.call('SET', key, struct.pack('<i8i8', a, b), 'PX', ttl)
end

local function store3(key, ttl, a, b, c)
  redis.call('SET', key, struct.pack('<i8i8i8', a, b, c), 'PX', ttl)
end
