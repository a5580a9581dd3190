-- tollgate: GCRA, the mirror of src/algorithm/gcra.rs.
-- State (tat): the theoretical arrival time (µs), when the bucket is full again; 0 = fresh.
-- Parameters: p1 = T (emission interval, µs per unit), p2 = cap (burst × T), p3 = burst.
-- `before + need` can exceed 2^53 only when it also exceeds cap, so the comparison is made as
-- `before <= cap - need` and the retry as `before - (cap - need)`: every value stays exact.

local gcra_load = load1

local function gcra_remaining(after, interval, cap)
  if after > cap then
    after = cap
  end
  return idiv(cap - after, interval)
end

local function gcra_decide(now, cost, interval, cap, burst, tat)
  local before = tat - now
  if before < 0 then
    before = 0
  end
  if cost > burst then
    return false, gcra_remaining(before, interval, cap), before, -1
  end
  local slack = cap - cost * interval
  if cost == 0 or before <= slack then
    local after = before + cost * interval
    return true, gcra_remaining(after, interval, cap), after, 0
  end
  return false, gcra_remaining(before, interval, cap), before, before - slack
end

local function gcra_apply(key, ttl, now, cost, interval, cap, burst, tat)
  if cost > burst then
    cost = burst
  end
  if now > tat then
    tat = now
  end
  store1(key, ttl, tat + cost * interval)
end

-- decide and, if allowed, apply, in one call: the single-limit fast path.
local function gcra_check(key, ttl, now, cost, interval, cap, burst, tat)
  local ok, remaining, reset, retry = gcra_decide(now, cost, interval, cap, burst, tat)
  if ok then
    if now > tat then
      tat = now
    end
    store1(key, ttl, tat + cost * interval)
  end
  return ok, remaining, reset, retry
end

local function gcra_refund(key, ttl, now, cost, interval, cap, burst, tat)
  if tat > now then
    tat = tat - cost * interval
    if tat < now then
      tat = now
    end
    store1(key, ttl, tat)
  end
  return tat
end
