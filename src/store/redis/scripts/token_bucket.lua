-- tollgate: token bucket, the mirror of src/algorithm/token_bucket.rs.
-- State (deficit, last): fixed-point steps missing from a full bucket, and the last charge (µs).
-- Parameters: p1 = unit (steps per token), p2 = per (steps earned per µs), p3 = cap (burst × unit).

-- The deficit at `now`: the stored one less what was earned since `last`, at least 0. A deficit
-- above cap (carried from a larger quota by tb_rebase) is kept: the bucket reads as empty until
-- the refill has paid the excess back. load2 reads only deficits below 2^53.
local function tb_deficit(now, per, _, deficit, last)
  local elapsed = now - last
  if elapsed < 0 then
    elapsed = 0
  end
  deficit = deficit - elapsed * per
  if deficit < 0 then
    return 0
  end
  return deficit
end

local tb_load = load2

-- Expiry. A key must outlive its state: it may expire only once its bucket is full again (the state
-- then equals a fresh key's), so every write leaves it alive until `last` + ttl at least (ttl
-- covers a refill from empty). tb_store writes with `PX ttl`, later by the time `last` is ahead of
-- `now` (Redis's clock went back). Setting the TTL is the dearest part of a write (Redis rewrites
-- `SET ... PX` as `SET ... PXAT` for propagation), so tb_fast (token_bucket_fast.lua) keeps the
-- key's TTL (`KEEPTTL`, Redis 6.0) when that provably suffices: time is cut into cells of `cell` µs
-- (an eighth of the ttl), and a write keeps the TTL only if it falls in the cell of the key's last
-- write and not before it (`last` <= `now`), and leaves a bucket full again within `keep` µs (the
-- ttl less a cell and 2 ms). Every write since the key's last TTL-setting write (whose state said
-- `last` = L, with the key alive until L + ttl - 2 ms whatever millisecond Redis stamped the write
-- with) is then in L's cell, so before L + cell, and its bucket is full before L + cell + keep = L
-- + ttl - 2 ms: the key expires no earlier than that. Keeping the TTL never makes a key live longer
-- than the write that set it allowed; it may expire up to a cell sooner after its last write than a
-- key whose every write sets the TTL, and only ever once its bucket is full. A key written at least
-- once a cell keeps most of its writes cheap; a sparser one sets the TTL on every write.
-- Writes by other code (plans, refunds, groups of several limits) all go through tb_store.

-- Writes the state (deficit, last), alive for ttl (ms) past `last`, or, for a deficit above cap
-- (carried from a larger quota), until it has all refilled: ceil(deficit / per) µs past `last`.
-- The ttl stays a string of digits: Redis 7.2 and later format a Lua number as `1e+08` when it
-- ends in many zeros.
local function tb_store(key, ttl, now, deficit, last, per, cap)
  local ms = tonumber(ttl)
  local extended = false
  if deficit > cap then
    local full = cdiv(cdiv(deficit, per), 1000)
    if full > ms then
      ms, extended = full, true
    end
  end
  if last > now then
    ms, extended = ms + cdiv(last - now, 1000), true
  end
  if extended then
    ttl = ttl_digits(ms)
  end
  store2(key, ttl, deficit, last)
end

-- floor((cap - min(deficit, cap)) / unit): whole units left.
local function tb_remaining(deficit, unit, cap)
  if deficit >= cap then
    return 0
  end
  return idiv(cap - deficit, unit)
end

-- Nothing refills before `last`: a lock carried from a larger quota (tb_rebase), or a clock
-- reading earlier than one already seen. Every wait runs from `last`.
local function tb_lock(now, last)
  if last > now then
    return last - now
  end
  return 0
end

local function tb_decide(now, cost, unit, per, cap, deficit, last)
  deficit = tb_deficit(now, per, cap, deficit, last)
  local lock = tb_lock(now, last)
  local limit = cap / unit
  if cost > limit then
    return false, tb_remaining(deficit, unit, cap), lock + cdiv(deficit, per), -1
  end
  local after = deficit + cost * unit
  if after <= cap then
    return true, idiv(cap - after, unit), lock + cdiv(after, per), 0
  end
  if cost == 0 then
    -- A deficit above cap (carried from a larger quota): empty, whole once it has refilled.
    return true, 0, lock + cdiv(deficit, per), 0
  end
  -- after - cap, computed without `after`, which can pass 2^53 (a deficit carried near it)
  -- where a double no longer counts every microsecond.
  return false, tb_remaining(deficit, unit, cap), lock + cdiv(deficit, per),
    lock + cdiv(deficit - (cap - cost * unit), per)
end

local function tb_apply(key, ttl, now, cost, unit, per, cap, deficit, last)
  deficit = tb_deficit(now, per, cap, deficit, last)
  -- An allowed charge ends at most at cap; a cost of 0 keeps a deficit above it.
  local after = deficit + cost * unit
  if after > cap and after > deficit then
    if deficit > cap then
      after = deficit
    else
      after = cap
    end
  end
  if now > last then
    last = now
  end
  tb_store(key, ttl, now, after, last, per, cap)
end

-- decide and, if allowed, apply, in one call: the single-limit fast path.
local function tb_check(key, ttl, now, cost, unit, per, cap, deficit, last)
  deficit = tb_deficit(now, per, cap, deficit, last)
  local lock = tb_lock(now, last)
  if cost * unit > cap then
    return false, tb_remaining(deficit, unit, cap), lock + cdiv(deficit, per), -1
  end
  local after = deficit + cost * unit
  if after <= cap or cost == 0 then
    if now > last then
      last = now
    end
    tb_store(key, ttl, now, after, last, per, cap)
    return true, tb_remaining(after, unit, cap), lock + cdiv(after, per), 0
  end
  -- after - cap, computed without `after`, which can pass 2^53 (a deficit carried near it)
  -- where a double no longer counts every microsecond.
  return false, tb_remaining(deficit, unit, cap), lock + cdiv(deficit, per),
    lock + cdiv(deficit - (cap - cost * unit), per)
end

-- Gives back what a reservation of `cost` at `at` still takes from the bucket, applied at `now`:
-- `cost` less the refill since the reservation (a bucket without it may have been full and lost
-- that refill), so the key is never fuller than it would be had the reservation never been made.
local function tb_refund(key, ttl, at, now, cost, unit, per, cap, deficit, last)
  deficit = tb_deficit(now, per, cap, deficit, last)
  if now > last then
    last = now
  end
  local since = last - at
  if since < 0 then
    since = 0
  end
  local give = cost * unit - since * per
  if give > 0 then
    deficit = deficit - give
    if deficit < 0 then
      deficit = 0
    end
  end
  tb_store(key, ttl, now, deficit, last, per, cap)
  return deficit, last
end

-- Plan change (TokenBucket::rebase): the state was written at (ounit, oper, ocap) and
-- a check arrives at (unit, per, cap). What the key spent, in whole units rounded up, stays spent,
-- all of it (above the new capacity too), at most 2^53 - 1 steps. Returns the new state without
-- storing it (the check stores it only if it charges something; see `replan` in the driver).
local function tb_rebase(_, _, now, ounit, oper, ocap, unit, per, cap, deficit, last)
  if ounit < 1 then
    ounit = 1 -- only a mark written by something else (see read_mark)
  end
  if oper < 1 then
    oper = 1
  end
  deficit, last = bucket_carry(ounit, oper, unit, cap, tb_deficit(now, oper, ocap, deficit, last),
    tb_lock(now, last))
  last = now + last
  if last > MAX_EXACT - 1 then
    last = MAX_EXACT - 1
  end
  return deficit, last
end


-- The token bucket for the dispatch (dispatch.lua): load, decide, apply, refund, rebase, check.
local function tb_algorithm()
  return tb_load, tb_decide, tb_apply, tb_refund, tb_rebase, tb_check
end
