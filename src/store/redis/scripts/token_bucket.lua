-- tollgate: token bucket, the mirror of src/algorithm/token_bucket.rs.
-- State (deficit, last): fixed-point steps missing from a full bucket, and the last charge (µs).
-- Parameters: p1 = unit (steps per token), p2 = per (steps earned per µs), p3 = cap (burst × unit).

local function tb_deficit(st, now, per, cap)
  local deficit = st[1]
  if deficit > cap then
    deficit = cap -- the quota shrank since this state was written
  end
  local elapsed = now - st[2]
  if elapsed < 0 then
    elapsed = 0
  end
  deficit = deficit - elapsed * per
  if deficit < 0 then
    deficit = 0
  end
  return deficit
end

local function tb_load(key)
  local st, corrupt = load_ints(key, 2)
  return st or { 0, 0 }, corrupt
end

local function tb_decide(st, now, cost, unit, per, cap)
  local deficit = tb_deficit(st, now, per, cap)
  local limit = cap / unit
  if cost > limit then
    return false, idiv(cap - deficit, unit), cdiv(deficit, per), -1
  end
  local after = deficit + cost * unit
  if after <= cap then
    return true, idiv(cap - after, unit), cdiv(after, per), 0
  end
  return false, idiv(cap - deficit, unit), cdiv(deficit, per), cdiv(after - cap, per)
end

local function tb_apply(key, st, now, cost, unit, per, cap, ttl)
  local deficit = tb_deficit(st, now, per, cap) + cost * unit
  if deficit > cap then
    deficit = cap
  end
  local last = st[2]
  if now > last then
    last = now
  end
  store_ints(key, ttl, deficit, last)
end

local function tb_refund(key, st, now, cost, unit, per, cap, ttl)
  local deficit = tb_deficit(st, now, per, cap) - cost * unit
  if deficit < 0 then
    deficit = 0
  end
  local last = st[2]
  if now > last then
    last = now
  end
  store_ints(key, ttl, deficit, last)
  return { deficit, last }
end
