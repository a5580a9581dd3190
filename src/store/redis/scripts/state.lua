-- tollgate: key state: reading, checking and writing a key's state, and the plan mark.

-- State is stored as little-endian 64-bit integers (struct 'i8'): no decimal conversion on
-- the hot path, and every value an exact integer. Loaders return `corrupt` first, then the
-- state's integers (zeros for a missing key, which is a fresh key).

-- Plan changes (see src/algorithm's "Plan changes" sections): a key's state may be
-- followed by a 24-byte mark, the parameters p1, p2, p3 it was written under, when those are not
-- the limit's own (the LIMIT constants): a check at a plan's quota writes it. A key without a mark
-- was written at the limit's own parameters, so the common path (no plan) reads and writes
-- exactly the bytes it always did. MARK is what the writes below append: '' unless the driver set
-- it for a check at other parameters.
local MARK = ''
local MARK_LEN = 24

-- Each algorithm's file ends with `<name>_algorithm()` (its name as in script.rs's `script_of`
-- and in its keys), returning its functions for the dispatch (dispatch.lua): load, decide, apply,
-- refund, rebase, then check (decide-then-apply in one call) or false.
-- docs/internals/redis-script.md says what each takes and returns.

-- Values the driver read ahead with one MGET for a batch (key -> string; missing keys and keys
-- of another type are left out and read below). Each is taken once: a key that appears again in
-- the batch is read with GET, after the write the first decision made.
local PREFETCHED = {}

-- The value at `key` if it is a string of `len` bytes (or `len` + MARK_LEN: marked), or any
-- positive multiple of 16 when `len` is 0; false if the key is missing; nil, after deleting the
-- key, if it holds anything else.
local function read_state(key, len)
  local v = PREFETCHED[key]
  if v then
    PREFETCHED[key] = nil
  else
    v = redis.pcall('GET', key)
    if v == false then
      return false
    end
  end
  if type(v) == 'string' and (#v == len or (len == 0 and #v > 0 and #v % 16 == 0)
    or (len > 0 and #v == len + MARK_LEN)) then
    return v
  end
  redis.call('DEL', key)
  return nil
end

-- Deletes a key whose integers are out of range; returns true (corrupt) and zeros.
local function reset_state(key)
  redis.call('DEL', key)
  return true, 0, 0, 0
end

-- The mark after `len` bytes of state: p1, p2, p3, or nil if they are out of range. p2 (a
-- count or a rate) is at least 1; p1 is a divisor unless p3 names a calendar (a fixed window's
-- calendar month has p1 = 0), so it is at least 1 when p3 is 0 or p1 would divide (buckets:
-- p3 = cap >= p1).
local function read_mark(v, len)
  local m1, m2, m3 = struct.unpack('<i8i8i8', v, len + 1)
  if m2 < 1 or (m1 < 1 and m3 == 0) or out_of_range(m1) or out_of_range(m2)
    or out_of_range(m3) then
    return nil
  end
  return m1, m2, m3
end

-- Returns corrupt, a, b, and, for a marked key, 0 and the mark's p1, p2, p3.
local function load2(key)
  local v = read_state(key, 16)
  if not v then
    return v == nil, 0, 0
  end
  local a, b = struct.unpack('<i8i8', v)
  if a < 0 or a >= MAX_EXACT or b < 0 or b >= MAX_EXACT then
    return reset_state(key)
  end
  if #v > 16 then
    local m1, m2, m3 = read_mark(v, 16)
    if m1 == nil then
      return reset_state(key)
    end
    return false, a, b, 0, m1, m2, m3
  end
  return false, a, b
end

-- Returns corrupt, a, b, c, and, for a marked key, the mark's p1, p2, p3.
local function load3(key)
  local v = read_state(key, 24)
  if not v then
    return v == nil, 0, 0, 0
  end
  local a, b, c = struct.unpack('<i8i8i8', v)
  if out_of_range(a) or out_of_range(b) or out_of_range(c) then
    return reset_state(key)
  end
  if #v > 24 then
    local m1, m2, m3 = read_mark(v, 24)
    if m1 == nil then
      return reset_state(key)
    end
    return false, a, b, c, m1, m2, m3
  end
  return false, a, b, c
end

local function store2(key, ttl, a, b)
  redis.call('SET', key, struct.pack('<i8i8', a, b) .. MARK, 'PX', ttl)
end

local function store3(key, ttl, a, b, c)
  redis.call('SET', key, struct.pack('<i8i8i8', a, b, c) .. MARK, 'PX', ttl)
end

-- A bucket's spending carried from one quota to another (token_bucket.rs `carry`, shared by the
-- token bucket and GCRA): `deficit` steps at (ounit, oper) and `lock` µs before which nothing
-- refills, to (unit, cap). The units that fit cap are carried as units (rounded up); the units
-- above cap as the time the old quota takes to refill them (a lock: empty until it ends). A lock
-- the state already carries stays a lock, whole. Returns the new deficit and lock. The one
-- product that may pass 2^53 is compared without being computed.
local function bucket_carry(ounit, oper, unit, cap, deficit, lock)
  local burst = cap / unit
  -- deficit > burst * ounit, without the product.
  local whole = idiv(deficit, ounit)
  if whole > burst or (whole == burst and deficit - burst * ounit > 0) then
    return cap, lock + cdiv(deficit - burst * ounit, oper)
  end
  if lock > 0 then
    return cap, lock
  end
  return cdiv(deficit, ounit) * unit, 0
end

-- A decision as its reply's integers: allowed (1/0), remaining, reset, retry, corrupt (1/0). A
-- rejection waits at least 1 µs (as Decision::rejected); reset and retry past 2^53 come only
-- from state no transition produces (hand-written, or from another clock) and are capped.
local function decided(ok, remaining, reset, retry, corrupt)
  if not ok and retry == 0 then
    retry = 1
  end
  if reset > MAX_EXACT then
    reset = MAX_EXACT
  end
  if retry > MAX_EXACT then
    retry = MAX_EXACT
  end
  return ok and 1 or 0, remaining, reset, retry, corrupt and 1 or 0
end
