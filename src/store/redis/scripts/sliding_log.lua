-- tollgate: sliding window log, the mirror of src/algorithm/sliding_log.rs.
-- State: one string. A 16-byte header (total, magic): the units of every stored entry and
-- SL_MAGIC; then the admissions still inside the window, oldest first, as (at, units) pairs of
-- 64-bit integers, 16 bytes each (strictly increasing `at`, µs; `units` >= 1). A key holds at most
-- L entries (admissions in the same µs are coalesced), and the Redis store refuses L above
-- MAX_REDIS_SLIDING_LOG, so a key is at most 16 × (L + 1) bytes. Parameters: p1 = W (window
-- length, µs), p2 = L.
--
-- Entries are read where they lie in the string (struct.unpack at an offset), never unpacked
-- as a whole: a decision reads the header, the newest entry, the entries that left the window
-- and, when rejecting, the oldest live entries until enough units would be freed. A rejected
-- request therefore costs O(cost) entries, not O(log); an admission also rewrites the string
-- (one copy, no per-entry work).
local SL_MAGIC = 1936483175

local function sl_empty()
  return { v = '', n = 0, total = 0 }
end

-- Entry i (1-based) of the state: at, units.
local function sl_entry(st, i)
  return struct.unpack('<i8i8', st.v, 16 * i + 1)
end

-- Returns corrupt and the state: { v = the stored string, n = entries, total = units }.
local function sl_load(key)
  local v = read_state(key, 0)
  if not v then
    return v == nil, sl_empty()
  end
  local total, magic = struct.unpack('<i8i8', v)
  local st = { v = v, n = #v / 16 - 1, total = total }
  local ok = magic == SL_MAGIC and st.n >= 1 and total >= st.n and total < MAX_EXACT
  if ok then
    local first, units = sl_entry(st, 1)
    local last, lunits = sl_entry(st, st.n)
    ok = not out_of_range(first) and not out_of_range(last) and first <= last
      and units >= 1 and lunits >= 1
  end
  if not ok then
    redis.call('DEL', key)
    return true, sl_empty()
  end
  return false, st
end

-- t = max(now, newest at), the number of entries that left the window by t, the units of the
-- live ones, and the newest entry's time.
local function sl_view(st, now, period)
  local t, newest = now, 0
  if st.n > 0 then
    newest = sl_entry(st, st.n)
    if newest > t then
      t = newest
    end
  end
  local expired, gone = 0, 0
  while expired < st.n do
    local at, units = sl_entry(st, expired + 1)
    if at + period > t then
      break
    end
    expired = expired + 1
    gone = gone + units
  end
  local used = st.total - gone
  if used < 0 then
    used = 0
  end
  return t, expired, used, newest
end

local function sl_leaves(at, now, period)
  local d = at + period - now
  if d < 0 then
    return 0
  end
  return d
end

local function sl_decide(now, cost, period, limit, _, st)
  local t, expired, used, newest = sl_view(st, now, period)
  local reset_now = 0
  if expired < st.n then
    reset_now = sl_leaves(newest, now, period)
  end
  local remaining_now = limit - used
  if remaining_now < 0 then
    remaining_now = 0
  end
  if cost > limit then
    return false, remaining_now, reset_now, -1
  end
  local after = used + cost
  if after <= limit then
    local reset = reset_now
    if cost > 0 then
      reset = sl_leaves(t, now, period)
    end
    return true, limit - after, reset, 0
  end
  -- Free `after - L` units: wait for the oldest live entries to leave (at most `excess` of them,
  -- each holds at least one unit).
  local excess, freed, retry = after - limit, 0, reset_now
  for i = expired + 1, st.n do
    local at, units = sl_entry(st, i)
    freed = freed + units
    if freed >= excess then
      retry = sl_leaves(at, now, period)
      break
    end
  end
  return false, remaining_now, reset_now, retry
end

-- Writes `body` (entries) with its header, or deletes the key when there are none.
local function sl_store(key, ttl, body, total)
  if #body == 0 then
    redis.call('DEL', key)
    return sl_empty()
  end
  local v = struct.pack('<i8i8', total, SL_MAGIC) .. body
  redis.call('SET', key, v, 'PX', ttl)
  return { v = v, n = #body / 16, total = total }
end

local function sl_apply(key, ttl, now, cost, period, limit, _, st)
  local t, expired, used, newest = sl_view(st, now, period)
  local room = limit - used
  if room < 0 then
    room = 0
  end
  if cost > room then
    cost = room
  end
  -- The live entries, without the header and the entries that left the window.
  local body = string.sub(st.v, 16 * (expired + 1) + 1)
  if cost > 0 then
    if #body > 0 and newest == t then
      local _, units = sl_entry(st, st.n)
      body = string.sub(body, 1, #body - 16) .. struct.pack('<i8i8', t, units + cost)
    else
      body = body .. struct.pack('<i8i8', t, cost)
    end
  end
  sl_store(key, ttl, body, used + cost)
end

-- Gives back up to `cost` units charged at `now` from the entry they were added to, the entry
-- at exactly `now`. Admissions at later times are other requests' and are never touched. If the
-- clock went back when the charge was made (it then went to the newest entry, after `now`) or
-- the entry has left the window, nothing is given back: a refund can only ever give back less.
local function sl_refund(key, ttl, now, cost, period, limit, _, st)
  local _, expired, used = sl_view(st, now, period)
  -- Binary search for the first live entry with at >= now (entries are strictly increasing).
  local lo, hi = expired + 1, st.n + 1
  while lo < hi do
    local mid = lo + idiv(hi - lo, 2)
    if sl_entry(st, mid) >= now then
      hi = mid
    else
      lo = mid + 1
    end
  end
  if lo > st.n or cost == 0 or sl_entry(st, lo) ~= now then
    return st
  end
  local at, units = sl_entry(st, lo)
  local take = units
  if take > cost then
    take = cost
  end
  local before = string.sub(st.v, 16 * (expired + 1) + 1, 16 * lo)
  local after = string.sub(st.v, 16 * (lo + 1) + 1)
  local entry = ''
  if units > take then
    entry = struct.pack('<i8i8', at, units - take)
  end
  local total = used - take
  if total < 0 then
    total = 0
  end
  return sl_store(key, ttl, before .. entry .. after, total)
end
