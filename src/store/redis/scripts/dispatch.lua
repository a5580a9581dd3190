-- tollgate: the dispatch. Maps a limit's configuration index to its algorithm's functions
-- (ALGORITHMS, registered by the algorithm files) and parameters (CONFIG, this store's limits,
-- generated just before this file). See docs/internals/redis-script.md.

-- Limit i's entry of CONFIG and its algorithm's functions.
local function config(i)
  local c = CONFIG[i + 1]
  if c == nil then
    error('tollgate: unknown limit ' .. tostring(i))
  end
  return c, ALGORITHMS[c[1]]
end

-- Limit i's load, decide, apply, refund and check (or nil), then its ttl_ms (a string), p1, p2,
-- p3.
local function LIMIT(i)
  local c, a = config(i)
  return a.load, a.decide, a.apply, a.refund, a.check, c[2], c[3], c[4], c[5]
end

-- Limit i's plan change (`Algorithm::rebase`, mirrored by each algorithm's `_rebase`).
local function REBASE(i)
  local _, a = config(i)
  return a.rebase
end

-- Whether a batch reads its keys ahead with one MGET: unless one of the store's algorithms reads
-- its state in pieces (`prefetch = false`: a sliding log).
local PREFETCH = true
for i = 1, #CONFIG do
  if ALGORITHMS[CONFIG[i][1]].prefetch == false then
    PREFETCH = false
  end
end

-- Limit 0's fused batch check (its algorithm's `fast`, where the batch reads ahead; else false),
-- with its ttl_ms, parameters, and the cell and refill bound (µs) of its TTL-keeping writes
-- ("Expiry" in token_bucket.lua).
local FAST, FAST_TTL, FAST_P1, FAST_P2, FAST_P3, FAST_CELL, FAST_KEEP = false
do
  local c = CONFIG[1]
  local fast = c and PREFETCH and ALGORITHMS[c[1]].fast
  if fast then
    FAST, FAST_TTL, FAST_P1, FAST_P2, FAST_P3, FAST_CELL, FAST_KEEP =
      fast, c[2], c[3], c[4], c[5], c[6], c[7]
  end
end
