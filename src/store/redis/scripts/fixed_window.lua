-- tollgate: fixed window, the mirror of src/algorithm/fixed_window.rs.
-- State (window, count): the index of the window last charged (floor(now / P)) and the units
-- charged in it. Parameters: p1 = P (window length, µs), p2 = L (units per window), p3 = 0.
-- A calendar-aligned window (src/quota/calendar.rs) has p3 = its UTC offset in µs plus one day
-- (always positive) and p1 = the hour or the day in µs, or 0 for calendar months; `now` is
-- then Unix time and windows are counted in local time, `local = max(now + offset, 0)`.

local FW_DAY = 86400000000

-- Days from 1970-01-01 to the first of month m (1..12) of year y >= 1970 (Hinnant's
-- days_from_civil with d = 1; every step is a non-negative integer).
local function fw_days_from_civil(y, m)
  if m <= 2 then
    y = y - 1
  end
  local era = idiv(y, 400)
  local yoe = y - era * 400
  local mp = m + 9
  if m > 2 then
    mp = m - 3
  end
  local doe = yoe * 365 + idiv(yoe, 4) - idiv(yoe, 100) + idiv(153 * mp + 2, 5)
  return era * 146097 + doe - 719468
end

-- Months since January 1970 of day z >= 0 since 1970-01-01 (Hinnant's civil_from_days).
local function fw_month_of(z)
  z = z + 719468
  local era = idiv(z, 146097)
  local doe = z - era * 146097
  local yoe = idiv(doe - idiv(doe, 1460) + idiv(doe, 36524) - idiv(doe, 146096), 365)
  local doy = doe - (365 * yoe + idiv(yoe, 4) - idiv(yoe, 100))
  local mp = idiv(5 * doy + 2, 153)
  local y = yoe + era * 400
  if mp < 10 then
    return (y - 1970) * 12 + mp + 2
  end
  return (y + 1 - 1970) * 12 + mp - 10
end

-- The index of the window holding `now`.
local function fw_index(now, period, cal)
  if cal == 0 then
    return idiv(now, period)
  end
  local l = now + cal - FW_DAY
  if l < 0 then
    l = 0
  end
  if period > 0 then
    return idiv(l, period)
  end
  return fw_month_of(idiv(l, FW_DAY))
end

-- Microseconds from `now` to the end of window w (0 if it has ended).
local function fw_until_end(w, now, period, cal)
  local e
  if cal ~= 0 and period == 0 then
    local n = w + 1
    local y = idiv(n, 12)
    e = fw_days_from_civil(1970 + y, n - y * 12 + 1) * FW_DAY
  else
    e = (w + 1) * period
  end
  if cal ~= 0 then
    e = e - (cal - FW_DAY)
  end
  e = e - now
  if e < 0 then
    e = 0
  end
  return e
end

-- The effective window at `now` and the units already charged in it.
local function fw_window(now, period, limit, cal, window, count)
  local w = fw_index(now, period, cal)
  if w > window then
    return w, 0
  end
  return window, count -- a count above the limit (carried from a larger quota) is kept
end

local fw_load = load2

local function fw_decide(now, cost, period, limit, cal, window, count)
  local w, used = fw_window(now, period, limit, cal, window, count)
  local e = fw_until_end(w, now, period, cal)
  local remaining = limit - used
  if remaining < 0 then
    remaining = 0
  end
  if cost > limit then
    return false, remaining, used > 0 and e or 0, -1
  end
  local after = used + cost
  if after <= limit or cost == 0 then
    -- A cost of 0 is allowed even when a count carried from a larger quota is above the limit.
    local left = limit - after
    if left < 0 then
      left = 0
    end
    return true, left, after > 0 and e or 0, 0
  end
  return false, remaining, e, e
end

local function fw_apply(key, ttl, now, cost, period, limit, cal, window, count)
  local w, used = fw_window(now, period, limit, cal, window, count)
  -- An allowed charge ends at most at the limit; a cost of 0 keeps a count above it.
  local after = used + cost
  if after > limit and after > used then
    if used > limit then
      after = used
    else
      after = limit
    end
  end
  -- A window later than the current one (carried from a longer one by fw_rebase) is kept
  -- until it ends.
  local e = cdiv(fw_until_end(w, now, period, cal), 1000)
  if e > tonumber(ttl) then
    ttl = ttl_digits(e)
  end
  store2(key, ttl, w, after)
end

-- Gives back units charged at `now` only while the stored window is still the one they were
-- charged to: once the window has moved on, its count is another window's and stays as it is
-- (a refund never frees units of a window it did not charge). `now` is the reservation's time;
-- the time the refund is applied (the fourth argument) does not matter.
local function fw_refund(key, ttl, now, _, cost, period, limit, cal, window, count)
  if window == fw_index(now, period, cal) then
    count = count - cost
    if count < 0 then
      count = 0
    end
    store2(key, ttl, window, count)
  end
  return window, count
end

-- Plan change (FixedWindow::rebase): the state was written with windows of `operiod`
-- (calendar `ocal`) and a check arrives with windows of `period` (calendar `cal`). With the same
-- windows, the count carries over as it is (the new limit applies to it). Otherwise the units
-- charged in the window current at t stay charged, in the new window holding the end of the old
-- one (the current one, or a later one when the new windows are shorter; not clamped: a count
-- above the new limit reads as exhausted until that window ends); t = now, or for epoch windows
-- max(now, the stored window's start). Returns the new state without storing it (the
-- check stores it only if it charges something; see `replan` in the driver).
local function fw_rebase(_, _, now, operiod, _, ocal, period, _, cal, window, count)
  if operiod == period and ocal == cal then
    return window, count
  end
  local t = now
  if ocal == 0 and window * operiod > t then
    t = window * operiod
  end
  if window ~= fw_index(t, operiod, ocal) then
    count = 0
  end
  local w = fw_index(t, period, cal)
  if count > 0 then
    -- The count stays counted until the window it was counted in ends: it goes to the new
    -- window holding that end (a later one than the current when the new windows are shorter).
    local last = fw_index(t + fw_until_end(window, t, operiod, ocal) - 1, period, cal)
    if last > w then
      w = last
    end
  end
  return w, count
end


-- The fixed window for the dispatch (dispatch.lua): load, decide, apply, refund, rebase, check
-- (none).
local function fw_algorithm()
  return fw_load, fw_decide, fw_apply, fw_refund, fw_rebase, false
end
