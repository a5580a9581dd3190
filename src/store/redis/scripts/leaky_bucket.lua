-- tollgate: leaky bucket (as a meter), the mirror of src/algorithm/leaky_bucket.rs.
-- State (level, last): fixed-point steps queued (0 = empty, a fresh key) and the last charge (µs).
-- Parameters: p1 = unit (steps per unit), p2 = per (steps drained per µs), p3 = cap (burst ×
-- unit). The arithmetic is the token bucket's, read as the level of a queue.

local function lb_level(st, now, per, cap)
  local level = st[1]
  if level > cap then
    level = cap -- a level stored under a larger capacity reads as a full queue
  end
  local elapsed = now - st[2]
  if elapsed < 0 then
    elapsed = 0
  end
  level = level - elapsed * per
  if level < 0 then
    level = 0
  end
  return level
end

local function lb_load(key)
  local st, corrupt = load_ints(key, 2)
  return st or { 0, 0 }, corrupt
end

local function lb_decide(st, now, cost, unit, per, cap)
  local level = lb_level(st, now, per, cap)
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

local function lb_apply(key, st, now, cost, unit, per, cap, ttl)
  local level = lb_level(st, now, per, cap) + cost * unit
  if level > cap then
    level = cap
  end
  local last = st[2]
  if now > last then
    last = now
  end
  store_ints(key, ttl, level, last)
end

local function lb_refund(key, st, now, cost, unit, per, cap, ttl)
  local level = lb_level(st, now, per, cap) - cost * unit
  if level < 0 then
    level = 0
  end
  local last = st[2]
  if now > last then
    last = now
  end
  store_ints(key, ttl, level, last)
  return { level, last }
end
