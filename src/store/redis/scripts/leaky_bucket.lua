-- tollgate: leaky bucket (as a meter), the mirror of src/algorithm/leaky_bucket.rs.
-- State (level, last): fixed-point steps queued (0 = empty, a fresh key) and the last charge (µs).
-- Parameters: p1 = unit (steps per unit), p2 = per (steps drained per µs), p3 = cap (burst ×
-- unit). The arithmetic is the token bucket's, read as the level of a queue.

-- The level at `now`: min(level, cap) less what drained since `last`, at least 0.
local function lb_level(now, per, cap, level, last)
  if level > cap then
    level = cap -- a level stored under a larger capacity reads as a full queue
  end
  local elapsed = now - last
  if elapsed < 0 then
    elapsed = 0
  end
  level = level - elapsed * per
  if level < 0 then
    return 0
  end
  return level
end

local lb_load = load2

local function lb_decide(now, cost, unit, per, cap, level, last)
  level = lb_level(now, per, cap, level, last)
  local limit = cap / unit
  if cost > limit then
    return false, idiv(cap - level, unit), cdiv(level, per), -1
  end
  local after = level + cost * unit
  if after <= cap then
    return true, idiv(cap - after, unit), cdiv(after, per), 0
  end
  return false, idiv(cap - level, unit), cdiv(level, per), cdiv(after - cap, per)
end

local function lb_apply(key, ttl, now, cost, unit, per, cap, level, last)
  level = lb_level(now, per, cap, level, last) + cost * unit
  if level > cap then
    level = cap
  end
  if now > last then
    last = now
  end
  store2(key, ttl, level, last)
end

-- decide and, if allowed, apply, in one call: the single-limit fast path.
local function lb_check(key, ttl, now, cost, unit, per, cap, level, last)
  level = lb_level(now, per, cap, level, last)
  if cost * unit > cap then
    return false, idiv(cap - level, unit), cdiv(level, per), -1
  end
  local after = level + cost * unit
  if after <= cap then
    if now > last then
      last = now
    end
    store2(key, ttl, after, last)
    return true, idiv(cap - after, unit), cdiv(after, per), 0
  end
  return false, idiv(cap - level, unit), cdiv(level, per), cdiv(after - cap, per)
end

local function lb_refund(key, ttl, now, cost, unit, per, cap, level, last)
  level = lb_level(now, per, cap, level, last) - cost * unit
  if level < 0 then
    level = 0
  end
  if now > last then
    last = now
  end
  store2(key, ttl, level, last)
  return level, last
end
