-- tollgate: the driver. Runs groups of limits; each group is decided all-or-nothing.
--
-- KEYS[i]  the state key of limit i (all groups' limits, in order).
-- ARGV[1]  'c' to check: decide every limit of a group, then charge all of them only if all
--          allow (a rejected group writes nothing); or 'r' to refund what a check charged.
-- ARGV[2]  G, the number of groups. Then for each group: its number of limits and its time in
--          µs ('' reads the server's TIME once, shared by every such group).
-- Then 6 arguments per limit, in KEYS order: algorithm, cost, ttl_ms, p1, p2, p3.
--
-- Returns, per group, its time, then 5 integers per limit: allowed (1/0), remaining, reset (µs),
-- retry (µs; -1 when the cost exceeds the capacity) and corrupt (1 when the key held something
-- unreadable, which was deleted and treated as a fresh key). When a group is rejected, its
-- limits that would have allowed are reported as they stand, at cost 0 (as the memory store
-- does); a refund reports each limit after the refund, at cost 0.
local mode = ARGV[1]
local ngroups = tonumber(ARGV[2])
local base = 3 + 2 * ngroups
local server_now
local out = {}
local slot = {} -- where limit i's five integers start in `out`
local first = 0
local now

-- Decides limit i and writes its five integers.
local function decide(i, alg, st, cost, corrupt)
  local a = base + (i - 1) * 6
  local ok, remaining, reset, retry = DECIDE[alg](st, now, cost, tonumber(ARGV[a + 3]),
    tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5]))
  if not ok and retry == 0 then
    retry = 1 -- as Decision::rejected: a rejection always waits at least 1 µs
  end
  -- Only state no transition produces (hand-written, or from another clock) gets this far.
  if reset > MAX_EXACT then
    reset = MAX_EXACT
  end
  if retry > MAX_EXACT then
    retry = MAX_EXACT
  end
  local o = slot[i] or (#out + 1)
  slot[i] = o
  out[o] = ok and 1 or 0
  out[o + 1] = remaining
  out[o + 2] = reset
  out[o + 3] = retry
  out[o + 4] = corrupt and 1 or 0
  return ok
end
for g = 1, ngroups do
  local n = tonumber(ARGV[1 + 2 * g])
  now = tonumber(ARGV[2 + 2 * g])
  if now == nil then
    if server_now == nil then
      local t = redis.call('TIME')
      server_now = tonumber(t[1]) * 1000000 + tonumber(t[2])
    end
    now = server_now
  end
  out[#out + 1] = now
  local states, all = {}, true
  for i = first + 1, first + n do
    local a = base + (i - 1) * 6
    local alg = tonumber(ARGV[a])
    local st, corrupt = LOAD[alg](KEYS[i])
    local cost = tonumber(ARGV[a + 1])
    if mode == 'r' then
      st = REFUND[alg](KEYS[i], st, now, cost, tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4]),
        tonumber(ARGV[a + 5]), tonumber(ARGV[a + 2]))
      cost = 0
    end
    states[i] = st
    local ok = decide(i, alg, st, cost, corrupt)
    if not ok then
      all = false
    end
  end
  if mode ~= 'r' then
    if all then
      for i = first + 1, first + n do
        local a = base + (i - 1) * 6
        APPLY[tonumber(ARGV[a])](KEYS[i], states[i], now, tonumber(ARGV[a + 1]),
          tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5]),
          tonumber(ARGV[a + 2]))
      end
    else
      -- Nothing is charged: report the limits that would have allowed as they stand (cost 0).
      for i = first + 1, first + n do
        if out[slot[i]] == 1 then
          local a = base + (i - 1) * 6
          decide(i, tonumber(ARGV[a]), states[i], 0, out[slot[i] + 4] == 1)
        end
      end
    end
  end
  first = first + n
end
return out
