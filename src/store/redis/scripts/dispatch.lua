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
