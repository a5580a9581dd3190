-- tollgate: GCRA, the mirror of src/algorithm/gcra.rs.
-- State (tat): the theoretical arrival time (µs), when the bucket is full again; 0 = fresh.
-- Parameters: p1 = T (emission interval, µs per unit), p2 = cap (burst × T), p3 = burst.
-- `before + need` can exceed 2^53 only when it also exceeds cap, so the comparison is made as
-- `before <= cap - need` and the retry as `before - (cap - need)`: every value stays exact.

local function gcra_load(key)
  local st, corrupt = load_ints(key, 1)
  return st or { 0 }, corrupt
end

local function gcra_remaining(after, interval, cap)
  if after > cap then
    after = cap
  end
  return idiv(cap - after, interval)
end

local function gcra_decide(st, now, cost, interval, cap, burst)
  local before = st[1] - now
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

local function gcra_apply(key, st, now, cost, interval, cap, burst, ttl)
  if cost > burst then
    cost = burst
  end
  local tat = st[1]
  if now > tat then
    tat = now
  end
  store_ints(key, ttl, tat + cost * interval)
end

local function gcra_refund(key, st, now, cost, interval, cap, burst, ttl)
  local tat = st[1]
  if tat > now then
    tat = tat - cost * interval
    if tat < now then
      tat = now
    end
    store_ints(key, ttl, tat)
    return { tat }
  end
  return st
end
