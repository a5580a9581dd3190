-- tollgate: integer helpers, run first. Every number handled here is an integer below 2^53,
-- where Lua's doubles are exact; integer division goes through idiv/cdiv, which correct the
-- rounding of `/`.
local floor = math.floor
-- Called for every decision: locals, rather than a global and a field looked up each time.
local redis_call, struct_pack, struct_unpack = redis.call, struct.pack, struct.unpack
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

-- ints[1..n] packed as little-endian 64-bit integers, at most 4 000 per struct.pack call (a
-- call's arguments live on Lua's C stack, which holds 8 000 values).
local function pack_ints(ints, n)
  local parts = {}
  for i = 1, n, 4000 do
    local j = i + 3999
    if j > n then
      j = n
    end
    parts[#parts + 1] = struct.pack('<' .. string.rep('i8', j - i + 1), unpack(ints, i, j))
  end
  return table.concat(parts)
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

-- Whether x is outside the integers state may hold.
local function out_of_range(x)
  return x < 0 or x >= MAX_EXACT
end

-- A TTL (ms) extended past the quota's own as a string of digits, at most 2^52 ms (about 142,000
-- years: any state a script writes itself is idle long before; a larger figure comes only from a
-- corrupted or hostile state, and Redis refuses an expire time beyond its own range).
local MAX_TTL_MS = 4503599627370496
local function ttl_digits(ms)
  if ms > MAX_TTL_MS then
    ms = MAX_TTL_MS
  end
  return string.format('%d', ms)
end
