-- tollgate: fixed window, the mirror of src/algorithm/fixed_window.rs.
-- State (window, count): the index of the window last charged (floor(now / P)) and the units
-- charged in it. Parameters: p1 = P (window length, µs), p2 = L (units per window).

-- The effective window at `now` and the units already charged in it.
local function fw_window(st, now, period, limit)
  local w = idiv(now, period)
  if w > st[1] then
    return w, 0
  end
  local used = st[2]
  if used > limit then
    used = limit
  end
  return st[1], used
end

local function fw_load(key)
  local st, corrupt = load_ints(key, 2)
  return st or { 0, 0 }, corrupt
end

local function fw_decide(st, now, cost, period, limit)
  local w, used = fw_window(st, now, period, limit)
  local e = (w + 1) * period - now
  if e < 0 then
    e = 0
  end
  if cost > limit then
    return false, limit - used, used > 0 and e or 0, -1
  end
  local after = used + cost
  if after <= limit then
    return true, limit - after, after > 0 and e or 0, 0
  end
  return false, limit - used, e, e
end

local function fw_apply(key, st, now, cost, period, limit, _, ttl)
  local w, used = fw_window(st, now, period, limit)
  local count = used + cost
  if count > limit then
    count = limit
  end
  store_ints(key, ttl, w, count)
end

local function fw_refund(key, st, now, cost, period, limit, _, ttl)
  local w = fw_window(st, now, period, limit)
  if w == st[1] then
    local count = st[2] - cost
    if count < 0 then
      count = 0
    end
    store_ints(key, ttl, w, count)
    return { w, count }
  end
  return st
end
