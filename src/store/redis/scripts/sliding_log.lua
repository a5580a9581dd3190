-- tollgate: sliding window log, the mirror of src/algorithm/sliding_log.rs.
-- State: the admissions still inside the window, oldest first, as (at, units) pairs of 64-bit
-- integers, 16 bytes each (strictly increasing `at`, µs; `units` >= 1). A request costs
-- O(entries) to read and rewrite; a key holds at most L entries (admissions in the same µs are
-- coalesced), which is why the sliding log suits low limits. Parameters: p1 = W (window
-- length, µs), p2 = L.

-- Returns corrupt and the state: { n, at = {...}, units = {...}, total }.
local function sl_load(key)
  local v = read_state(key, 0)
  local st = { n = 0, at = {}, units = {}, total = 0 }
  if not v then
    return v == nil, st
  end
  local pos = 1
  while pos <= #v do
    local at, units, nxt = struct.unpack('<i8i8', v, pos)
    local n = st.n
    if out_of_range(at) or units < 1 or units >= MAX_EXACT or (n > 0 and at <= st.at[n]) then
      redis.call('DEL', key)
      return true, { n = 0, at = {}, units = {}, total = 0 }
    end
    st.n = n + 1
    st.at[n + 1] = at
    st.units[n + 1] = units
    st.total = st.total + units
    pos = nxt
  end
  if st.total >= MAX_EXACT then
    redis.call('DEL', key)
    return true, { n = 0, at = {}, units = {}, total = 0 }
  end
  return false, st
end

-- t, the number of entries that left the window by t, and the units of the live ones.
local function sl_view(st, now, period)
  local t = now
  if st.n > 0 and st.at[st.n] > t then
    t = st.at[st.n]
  end
  local expired, gone = 0, 0
  while expired < st.n and st.at[expired + 1] + period <= t do
    expired = expired + 1
    gone = gone + st.units[expired]
  end
  return t, expired, st.total - gone
end

local function sl_leaves(at, now, period)
  local d = at + period - now
  if d < 0 then
    return 0
  end
  return d
end

local function sl_decide(now, cost, period, limit, _, st)
  local t, expired, used = sl_view(st, now, period)
  local reset_now = 0
  if expired < st.n then
    reset_now = sl_leaves(st.at[st.n], now, period)
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
  -- Free `after - L` units: wait for the oldest live entries to leave.
  local excess, freed, retry = after - limit, 0, reset_now
  for i = expired + 1, st.n do
    freed = freed + st.units[i]
    if freed >= excess then
      retry = sl_leaves(st.at[i], now, period)
      break
    end
  end
  return false, remaining_now, reset_now, retry
end

-- Drops the entries that left the window by t; returns t and the live units.
local function sl_prune(st, now, period)
  local t, expired, used = sl_view(st, now, period)
  if expired > 0 then
    local at, units = {}, {}
    for i = expired + 1, st.n do
      at[i - expired] = st.at[i]
      units[i - expired] = st.units[i]
    end
    st.at, st.units, st.n = at, units, st.n - expired
  end
  st.total = used
  return t, used
end

local function sl_store(key, st, ttl)
  if st.n == 0 then
    redis.call('DEL', key)
    return
  end
  local parts = {}
  for i = 1, st.n do
    parts[i] = struct.pack('<i8i8', st.at[i], st.units[i])
  end
  redis.call('SET', key, table.concat(parts), 'PX', ttl)
end

local function sl_apply(key, ttl, now, cost, period, limit, _, st)
  local t, used = sl_prune(st, now, period)
  local room = limit - used
  if room < 0 then
    room = 0
  end
  if cost > room then
    cost = room
  end
  if cost > 0 then
    if st.n > 0 and st.at[st.n] == t then
      st.units[st.n] = st.units[st.n] + cost
    else
      st.n = st.n + 1
      st.at[st.n] = t
      st.units[st.n] = cost
    end
    st.total = st.total + cost
  end
  sl_store(key, st, ttl)
end

local function sl_refund(key, ttl, now, cost, period, limit, _, st)
  sl_prune(st, now, period)
  local left = cost
  while left > 0 and st.n > 0 do
    local take = st.units[st.n]
    if take > left then
      take = left
    end
    st.units[st.n] = st.units[st.n] - take
    st.total = st.total - take
    left = left - take
    if st.units[st.n] == 0 then
      st.at[st.n] = nil
      st.units[st.n] = nil
      st.n = st.n - 1
    end
  end
  sl_store(key, st, ttl)
  return st
end
