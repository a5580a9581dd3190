-- tollgate: fixed window, the mirror of src/algorithm/fixed_window.rs.
-- State (window, count): the index of the window last charged (floor(now / P)) and the units
-- charged in it. Parameters: p1 = P (window length, µs), p2 = L (units per window).

-- The effective window at `now` and the units already charged in it.
local function fw_window(now, period, limit, window, count)
  local w = idiv(now, period)
  if w > window then
    return w, 0
  end
  if count > limit then
    count = limit
  end
  return window, count
end

local fw_load = load2

local function fw_decide(now, cost, period, limit, _, window, count)
  local w, used = fw_window(now, period, limit, window, count)
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

local function fw_apply(key, ttl, now, cost, period, limit, _, window, count)
  local w, used = fw_window(now, period, limit, window, count)
  used = used + cost
  if used > limit then
    used = limit
  end
  store2(key, ttl, w, used)
end

-- Gives back units charged at `now` only while the stored window is still the one they were
-- charged to: once the window has moved on, its count is another window's and stays as it is
-- (a refund never frees units of a window it did not charge). `now` is the reservation's time;
-- the time the refund is applied (the fourth argument) does not matter.
local function fw_refund(key, ttl, now, _, cost, period, limit, _, window, count)
  if window == idiv(now, period) then
    count = count - cost
    if count < 0 then
      count = 0
    end
    store2(key, ttl, window, count)
  end
  return window, count
end
