-- tollgate: GCRA, the mirror of src/algorithm/gcra.rs.
-- State (tat, sub): the theoretical arrival time, tat + sub / per µs (when the bucket is full
-- again), in the token bucket's fixed point; (0, 0) = fresh.
-- Parameters: p1 = unit (steps per unit), p2 = per (steps per µs), p3 = cap (burst × unit).
-- `before + need` can exceed 2^53 only when it also exceeds cap, so the comparison is made as
-- `before <= cap - need` and the retry as `before - (cap - need)`: every value stays exact.

local gcra_load = load2

-- Steps until the bucket is full at `now`, at most 2^53 - 1 (only state the algorithm cannot have
-- written reaches it): `ahead * per + sub` is compared against the ceiling without computing it,
-- so the value is exact, as in Rust.
local GCRA_BEFORE_MAX = MAX_EXACT - 1

local function gcra_before(now, per, tat, sub)
  if tat < now then
    return 0
  end
  local ahead = tat - now
  if ahead > idiv(GCRA_BEFORE_MAX - sub, per) then
    return GCRA_BEFORE_MAX
  end
  return ahead * per + sub
end

local function gcra_remaining(after, unit, cap)
  if after > cap then
    after = cap
  end
  return idiv(cap - after, unit)
end

local function gcra_decide(now, cost, unit, per, cap, tat, sub)
  local before = gcra_before(now, per, tat, sub)
  if cost > cap / unit then
    return false, gcra_remaining(before, unit, cap), cdiv(before, per), -1
  end
  local slack = cap - cost * unit
  if cost == 0 or before <= slack then
    local after = before + cost * unit
    return true, gcra_remaining(after, unit, cap), cdiv(after, per), 0
  end
  return false, gcra_remaining(before, unit, cap), cdiv(before, per), cdiv(before - slack, per)
end

-- Stores the TAT `steps` steps after `base` µs; returns it. The key lives for ttl (ms), or, for a
-- TAT further ahead of `now` (carried from a larger quota by gcra_rebase), until the TAT. The ttl
-- stays a string of digits (see tb_store).
local function gcra_store(key, ttl, now, per, base, steps)
  local q = idiv(steps, per)
  local tat, sub = base + q, steps - q * per
  local ahead = cdiv(tat + 1 - now, 1000)
  if ahead > tonumber(ttl) then
    ttl = ttl_digits(ahead)
  end
  store2(key, ttl, tat, sub)
  return tat, sub
end

local function gcra_apply(key, ttl, now, cost, unit, per, cap, tat, sub)
  local burst = cap / unit
  if cost > burst then
    cost = burst
  end
  if tat < now then
    tat, sub = now, 0
  elseif sub >= per then
    sub = per - 1
  end
  gcra_store(key, ttl, now, per, tat, sub + cost * unit)
end

-- decide and, if allowed, apply, in one call: the single-limit fast path.
local function gcra_check(key, ttl, now, cost, unit, per, cap, tat, sub)
  local ok, remaining, reset, retry = gcra_decide(now, cost, unit, per, cap, tat, sub)
  if ok then
    gcra_apply(key, ttl, now, cost, unit, per, cap, tat, sub)
  end
  return ok, remaining, reset, retry
end

-- Gives back what a reservation of `cost` at `at` still takes from the key, applied at `now` (at
-- least `at`: the latest time the key is known to have seen): `cost` less the refill since the
-- reservation, so the key is never fuller than it would be had the reservation never been made.
local function gcra_refund(key, ttl, at, now, cost, unit, per, cap, tat, sub)
  if now < at then
    now = at
  end
  local before = gcra_before(now, per, tat, sub)
  if before > 0 then
    local give = cost * unit - (now - at) * per
    if give < 0 then
      give = 0
    end
    local steps = before - give
    if steps < 0 then
      steps = 0
    end
    return gcra_store(key, ttl, now, per, now, steps)
  end
  return tat, sub
end

-- Plan change (Gcra::rebase): the state was written at (ounit, oper, ocap) and a check arrives
-- at (unit, per, cap). The steps before full at the old quota are, up to its capacity, a deficit
-- and beyond it a lock (the time before anything refills); both are carried as the token bucket
-- carries them (bucket_carry in state.lua), and stored as a TAT that many steps after `now`, at
-- most min(2^53 - 1, (2^52 - 1) * per) steps so the TAT stays below 2^53; a key that spent
-- nothing is fresh. Returns the new state without storing it (the check stores it only if it
-- charges something; see `replan` in the driver).
local function gcra_rebase(_, _, now, ounit, oper, ocap, unit, per, cap, tat, sub)
  if ounit < 1 then
    ounit = 1 -- only a mark written by something else (see read_mark)
  end
  if oper < 1 then
    oper = 1
  end
  local before = gcra_before(now, oper, tat, sub)
  local deficit, lock = before, 0
  if before > ocap then
    deficit, lock = ocap, cdiv(before - ocap, oper)
  end
  deficit, lock = bucket_carry(ounit, oper, unit, cap, deficit, lock)
  if deficit == 0 and lock == 0 then
    return 0, 0
  end
  local most = (4503599627370496 - 1) * per -- (2^52 - 1) * per, exact or above 2^53
  if most > MAX_EXACT - 1 then
    most = MAX_EXACT - 1
  end
  local steps
  if lock > idiv(most - deficit, per) then
    steps = most
  else
    steps = lock * per + deficit
    if steps > most then
      steps = most
    end
  end
  local q = idiv(steps, per)
  return now + q, steps - q * per
end


-- GCRA for the dispatch (dispatch.lua): load, decide, apply, refund, rebase, check.
local function gcra_algorithm()
  return gcra_load, gcra_decide, gcra_apply, gcra_refund, gcra_rebase, gcra_check
end
