-- tollgate: sliding window counter, the mirror of src/algorithm/sliding_window.rs.
-- State (last, prev, cur): the time of the last charge (µs) and the counts of the window before
-- last's and of last's window. Parameters: p1 = W (window length, µs), p2 = L (units per
-- window). L × W < 2^53 (checked when the limit is built), so every product below is exact.
-- Counts above L (left by a larger, earlier limit) weigh as they are, up to (2^53 - 1) / W.

-- The counts as seen from t = max(now, last): e µs into t's window, previous and current.
local function sw_view(now, period, limit, last, sprev, scur)
  local t = last
  if now > t then
    t = now
  end
  local w, s = idiv(t, period), idiv(last, period)
  local prev, cur = 0, 0
  if w == s then
    prev, cur = sprev, scur
  elseif w == s + 1 then
    prev = scur
  end
  -- Counts above the limit (left by a larger, earlier one) weigh as they are, bounded by
  -- K = (2^53 - 1) / W so that prev * W stays exact (the Rust `view` does the same).
  local k = idiv(MAX_EXACT - 1, period)
  if prev > k then
    prev = k
  end
  if cur > k then
    cur = k
  end
  return t, t - w * period, prev, cur
end

-- The smallest e' >= e0 in the window at which floor(p × (W - e') / W) + c <= budget, or nil.
local function sw_fit(p, c, e0, budget, period)
  if c > budget then
    return nil
  end
  local m = budget - c
  if p <= m then
    return e0
  end
  local q = idiv((m + 1) * period - 1, p)
  if q == 0 then
    return nil
  end
  if period - q > e0 then
    return period - q
  end
  return e0
end

-- µs from now until the estimate is at most `budget`, charging nothing.
local function sw_wait(t, e, prev, cur, now, budget, period)
  local d
  local f = sw_fit(prev, cur, e, budget, period)
  if f ~= nil then
    d = f - e
  else
    f = sw_fit(cur, 0, 0, budget, period)
    if f ~= nil then
      d = (period - e) + f
    else
      d = 2 * period - e
    end
  end
  return (t - now) + d
end

local sw_load = load3

local function sw_decide(now, cost, period, limit, _, last, sprev, scur)
  local t, e, prev, cur = sw_view(now, period, limit, last, sprev, scur)
  local est = idiv(prev * (period - e), period) + cur
  local remaining_now = limit - est
  if remaining_now < 0 then
    remaining_now = 0
  end
  if cost > limit then
    return false, remaining_now, sw_wait(t, e, prev, cur, now, 0, period), -1
  end
  if cost <= remaining_now then
    return true, remaining_now - cost, sw_wait(t, e, prev, cur + cost, now, 0, period), 0
  end
  return false, remaining_now, sw_wait(t, e, prev, cur, now, 0, period),
    sw_wait(t, e, prev, cur, now, limit - cost, period)
end

local function sw_apply(key, ttl, now, cost, period, limit, _, last, sprev, scur)
  local t, _, prev, cur = sw_view(now, period, limit, last, sprev, scur)
  -- An allowed charge ends at most at the limit; a cost of 0 keeps a count above it (carried
  -- from a larger quota) as it is.
  local after = cur + cost
  if after > limit and after > cur then
    if cur > limit then
      after = cur
    else
      after = limit
    end
  end
  -- A `last` ahead of now (carried from a longer window by sw_rebase) is kept that much longer.
  if t > now then
    ttl = ttl_digits(tonumber(ttl) + cdiv(t - now, 1000))
  end
  store3(key, ttl, t, prev, after)
end

-- Gives back units charged at `now` to the counter of the window they were charged to: the
-- current count while `last` is still in that window, the previous count once `last` has moved
-- one window on (the units now weigh as the previous window's), nothing later. A refund never
-- frees units of a window it did not charge. `now` is the reservation's time; the time the
-- refund is applied (the fourth argument) does not matter.
local function sw_refund(key, ttl, now, _, cost, period, limit, _, last, sprev, scur)
  local charged, s = idiv(now, period), idiv(last, period)
  if s == charged then
    scur = scur - cost
    if scur < 0 then
      scur = 0
    end
  elseif s == charged + 1 then
    sprev = sprev - cost
    if sprev < 0 then
      sprev = 0
    end
  else
    return last, sprev, scur
  end
  store3(key, ttl, last, sprev, scur)
  return last, sprev, scur
end

-- Plan change (SlidingWindow::rebase): the state was written with windows of
-- `operiod` (limit `olimit`) and a check arrives with windows of `period`. With the same period,
-- counts are units and carry over as they are. Otherwise the weighted count at `now` (rounded up)
-- is what the key spent, charged to the new window current at `now`, or, for shorter new windows,
-- to the one holding the end of the old current window (`last` ahead of now). Returns the new state
-- without storing it (the check stores it only if it charges something; see `replan` in the
-- driver).
local function sw_rebase(_, _, now, operiod, olimit, _, period, _, _, last, sprev, scur)
  if operiod == period then
    return last, sprev, scur
  end
  local t, e, prev, cur = sw_view(now, operiod, olimit, last, sprev, scur)
  cur = cdiv(prev * (operiod - e), operiod) + cur
  if cur > 0 and period < operiod then
    -- The count stays counted until the old current window ends: it is charged to the new
    -- window holding that end (weighed from then on like any count).
    local start = idiv((idiv(t, operiod) + 1) * operiod - 1, period) * period
    if start > t then
      t = start
    end
  end
  return t, 0, cur
end


-- The sliding window counter for the dispatch (dispatch.lua): load, decide, apply, refund,
-- rebase, check (none).
local function sw_algorithm()
  return sw_load, sw_decide, sw_apply, sw_refund, sw_rebase, false
end
