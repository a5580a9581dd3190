-- tollgate: sliding window log, the mirror of src/algorithm/sliding_log.rs.
-- State: one string. A 24-byte header (total, magic, start): the units of the entries from
-- `start` on, SL_MAGIC, and the index of the first entry not yet dropped; then entries, oldest
-- first, as (at, units) pairs of 64-bit integers, 16 bytes each (strictly increasing `at`, µs;
-- `units` >= 1). Entries before `start` have left the window and wait for compaction.
-- Parameters: p1 = W (window length, µs), p2 = L.
--
-- The log is never read as a whole on a decision: entries are read where they lie with
-- GETRANGE, SL_CHUNK at a time, from `start` (the entries leaving the window, then, when
-- rejecting, the oldest live entries until enough units would be freed) and the newest entry.
-- An admission appends (APPEND) or adds to the newest entry (SETRANGE) and rewrites the header;
-- dropped entries are compacted away once there are more of them than live ones (and at least
-- 64), so the copy is amortised. So a rejected request costs O(cost) entries, an admission
-- O(1) amortised, and a key holds at most L live entries (admissions in the same µs are
-- coalesced) plus at most max(64, L) dropped ones: at most 24 + 16 × (2L + 64) bytes, with L
-- at most MAX_SLIDING_LOG on Redis. A refund (rare: Cluster requests rejected by another slot)
-- rewrites the live entries.
local SL_MAGIC = 1936483175
local SL_HEAD = 24
local SL_CHUNK = 32

local function sl_empty(key)
  return { key = key, n = 0, start = 0, total = 0, lo = 0, hi = 0, buf = '' }
end

-- Entry i (0-based, start <= i < n): at, units. Reads SL_CHUNK entries from i when i is not
-- in the chunk already read.
local function sl_entry(st, i)
  if i < st.lo or i >= st.hi then
    local from = SL_HEAD + 16 * i
    st.buf = redis.call('GETRANGE', st.key, from, from + 16 * SL_CHUNK - 1)
    st.lo, st.hi = i, i + idiv(#st.buf, 16)
  end
  return struct.unpack('<i8i8', st.buf, 16 * (i - st.lo) + 1)
end

local function sl_corrupt(key)
  redis.call('DEL', key)
  return true, sl_empty(key)
end

-- Returns corrupt and the state: { key, n = entries stored, start, total, and the chunk read }.
local function sl_load(key)
  local len = redis.pcall('STRLEN', key)
  if type(len) ~= 'number' then
    return sl_corrupt(key) -- not a string
  end
  if len == 0 then
    return false, sl_empty(key)
  end
  if len < SL_HEAD + 16 or (len - SL_HEAD) % 16 ~= 0 then
    return sl_corrupt(key)
  end
  local total, magic, start = struct.unpack('<i8i8i8', redis.call('GETRANGE', key, 0, SL_HEAD - 1))
  local st = sl_empty(key)
  st.n, st.start, st.total = (len - SL_HEAD) / 16, start, total
  if magic ~= SL_MAGIC or start < 0 or start >= st.n or out_of_range(total)
    or total < st.n - start then
    return sl_corrupt(key)
  end
  local last, lunits = sl_entry(st, st.n - 1)
  local first, units = sl_entry(st, start)
  if out_of_range(first) or out_of_range(last) or first > last or units < 1 or lunits < 1 then
    return sl_corrupt(key)
  end
  return false, st
end

-- t = max(now, newest at), the number of entries from `start` that left the window by t, the
-- units of the live ones, and the newest entry's time.
local function sl_view(st, now, period)
  local t, newest = now, 0
  if st.n > st.start then
    newest = sl_entry(st, st.n - 1)
    if newest > t then
      t = newest
    end
  end
  local expired, gone = 0, 0
  while st.start + expired < st.n do
    local at, units = sl_entry(st, st.start + expired)
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
  if st.start + expired < st.n then
    reset_now = sl_leaves(newest, now, period)
  end
  local remaining_now = limit - used
  if remaining_now < 0 then
    remaining_now = 0
  end
  if cost > limit then
    return false, remaining_now, reset_now, -1
  end
  if cost <= remaining_now then
    local reset = reset_now
    if cost > 0 then
      reset = sl_leaves(t, now, period)
    end
    return true, remaining_now - cost, reset, 0
  end
  local after = used + cost
  -- Free `after - L` units: wait for the oldest live entries to leave (at most `excess` of them,
  -- each holds at least one unit).
  local excess, freed, retry = after - limit, 0, reset_now
  for i = st.start + expired, st.n - 1 do
    local at, units = sl_entry(st, i)
    freed = freed + units
    if freed >= excess then
      retry = sl_leaves(at, now, period)
      break
    end
  end
  return false, remaining_now, reset_now, retry
end

local function sl_header(total, start)
  return struct.pack('<i8i8i8', total, SL_MAGIC, start)
end

local function sl_apply(key, ttl, now, cost, period, limit, _, st)
  if cost == 0 then
    -- Charges nothing, so changes nothing (SlidingLog::apply): entries older than this
    -- quota's window may still count for another.
    return
  end
  local t, expired, used, newest = sl_view(st, now, period)
  local room = limit - used
  if room < 0 then
    room = 0
  end
  if cost > room then
    cost = room
  end
  local start, n = st.start + expired, st.n
  if cost > 0 then
    if n == 0 then
      redis.call('SET', key, sl_header(cost, 0) .. struct.pack('<i8i8', t, cost), 'PX', ttl)
      return
    end
    if n > start and newest == t then
      local _, units = sl_entry(st, n - 1)
      redis.call('SETRANGE', key, SL_HEAD + 16 * (n - 1), struct.pack('<i8i8', t, units + cost))
    else
      redis.call('APPEND', key, struct.pack('<i8i8', t, cost))
      n = n + 1
    end
  end
  if start >= n then
    redis.call('DEL', key)
    return
  end
  local total = used + cost
  if start >= 64 and start > n - start then
    local live = redis.call('GETRANGE', key, SL_HEAD + 16 * start, -1)
    redis.call('SET', key, sl_header(total, 0) .. live, 'PX', ttl)
    return
  end
  redis.call('SETRANGE', key, 0, sl_header(total, start))
  redis.call('PEXPIRE', key, ttl)
end

-- Gives back up to `cost` units charged at `now` from the entry they were added to, the entry
-- at exactly `now`. Admissions at later times are other requests' and are never touched. If the
-- clock went back when the charge was made (it then went to the newest entry, after `now`) or
-- the entry has left the window, nothing is given back: a refund can only ever give back less.
-- `now` is the reservation's time; the time the refund is applied (the fourth argument) does not
-- matter.
local function sl_refund(key, ttl, now, _, cost, period, limit, _, st)
  local _, expired, used = sl_view(st, now, period)
  local start = st.start + expired
  -- Binary search for the first live entry with at >= now (entries are strictly increasing).
  local lo, hi = start, st.n
  while lo < hi do
    local mid = lo + idiv(hi - lo, 2)
    if sl_entry(st, mid) >= now then
      hi = mid
    else
      lo = mid + 1
    end
  end
  if lo >= st.n or cost == 0 or sl_entry(st, lo) ~= now then
    return st
  end
  local at, units = sl_entry(st, lo)
  local take = units
  if take > cost then
    take = cost
  end
  local before = redis.call('GETRANGE', key, SL_HEAD + 16 * start, SL_HEAD + 16 * lo - 1)
  if lo == start then
    before = ''
  end
  local after = ''
  if lo + 1 < st.n then
    after = redis.call('GETRANGE', key, SL_HEAD + 16 * (lo + 1), -1)
  end
  local entry = ''
  if units > take then
    entry = struct.pack('<i8i8', at, units - take)
  end
  local body = before .. entry .. after
  local total = used - take
  if total < 0 then
    total = 0
  end
  if #body == 0 then
    redis.call('DEL', key)
    return sl_empty(key)
  end
  redis.call('SET', key, sl_header(total, 0) .. body, 'PX', ttl)
  local _, fresh = sl_load(key)
  return fresh
end

-- Plan change (SlidingLog::rebase): entries are absolute times and units, which the
-- new window and limit read as they are: nothing changes.
local function sl_rebase(_, _, _, _, _, _, _, _, _, st)
  return st
end


-- The sliding log for the dispatch (dispatch.lua): load, decide, apply, refund, rebase, check
-- (none). A batch does not read its keys ahead when a limit is a log, which is read in pieces
-- (`PREFETCH`, generated by script.rs).
local function sl_algorithm()
  return sl_load, sl_decide, sl_apply, sl_refund, sl_rebase, false
end
