-- tollgate: the dispatch. Maps a limit's configuration index to its algorithm's functions and
-- its parameters. CONFIG(i), generated just before this file from the store's configuration,
-- returns limit i's algorithm (the `<name>_algorithm` function of its file) and parameters. See
-- docs/internals/redis-script.md.

-- Limit i's load, decide, apply, refund and check (or false), then its ttl_ms (a string: it only
-- goes to PX), p1, p2, p3.
local function LIMIT(i)
  local algorithm, ttl, p1, p2, p3 = CONFIG(i)
  if algorithm == nil then
    error('tollgate: unknown limit ' .. tostring(i))
  end
  local load, decide, apply, refund, _, check = algorithm()
  return load, decide, apply, refund, check, ttl, p1, p2, p3
end

-- Limit i's plan change (`Algorithm::rebase`, mirrored by each algorithm's `_rebase`).
local function REBASE(i)
  local algorithm = CONFIG(i)
  if algorithm == nil then
    error('tollgate: unknown limit ' .. tostring(i))
  end
  local _, _, _, _, rebase = algorithm()
  return rebase
end

-- How a batch runs (a 'b' call, or a Cluster master's 'n' call), worked out when one comes: Redis
-- runs the whole script on every call, and checks and refunds need none of it. Returns PREFETCH,
-- whether the batch reads its keys ahead with one MGET (unless one of the store's algorithms
-- reads its state in pieces: a sliding log), then FAST, limit 0's fused check (its algorithm's
-- `fast`, when the batch reads ahead; else false), with its ttl_ms, parameters, and the cell and
-- refill bound (µs) of its TTL-keeping writes ("Expiry" in token_bucket.lua; a fixed window's
-- cell is its period, see fw_fast).
local function batch_paths()
  local first, ttl, p1, p2, p3, cell, keep = CONFIG(0)
  local _, _, _, _, _, _, fast, prefetch = first()
  local i, algorithm = 1, CONFIG(1)
  while algorithm do
    local _, _, _, _, _, _, _, ahead = algorithm()
    if not ahead then
      prefetch = false
    end
    i = i + 1
    algorithm = CONFIG(i)
  end
  if prefetch and fast then
    return true, fast, ttl, p1, p2, p3, cell, keep
  end
  return prefetch, false
end
local PREFETCH, FAST, FAST_TTL, FAST_P1, FAST_P2, FAST_P3, FAST_CELL, FAST_KEEP
