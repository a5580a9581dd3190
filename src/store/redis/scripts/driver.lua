-- tollgate: the driver. Runs groups of limits; each group is decided all-or-nothing.
--
-- KEYS[i]  the state key of limit i (all groups' limits, in order).
-- ARGV[1]  'c' to check: decide every limit of a group, then charge all of them only if all
--          allow (a rejected group writes nothing); or 'r' to refund what a check charged.
-- ARGV[2]  G, the number of groups. Then for each group: its number of limits and its time in
--          µs ('' reads the server's TIME once, shared by every such group).
-- Then 6 arguments per limit, in KEYS order: algorithm, cost, ttl_ms, p1, p2, p3.
--
-- Returns, per group, its time, then in check mode 5 integers per limit: allowed (1/0),
-- remaining, reset (µs), retry (µs; -1 when the cost exceeds the capacity) and corrupt (1 when
-- the key held something unreadable, which was deleted and treated as a fresh key).
local mode = ARGV[1]
local ngroups = tonumber(ARGV[2])
local base = 3 + 2 * ngroups
local server_now
local out = {}
local first = 0
for g = 1, ngroups do
  local n = tonumber(ARGV[1 + 2 * g])
  local now = tonumber(ARGV[2 + 2 * g])
  if now == nil then
    if server_now == nil then
      local t = redis.call('TIME')
      server_now = tonumber(t[1]) * 1000000 + tonumber(t[2])
    end
    now = server_now
  end
  out[#out + 1] = now
  if mode == 'r' then
    for i = first + 1, first + n do
      local a = base + (i - 1) * 6
      local alg = tonumber(ARGV[a])
      local st = LOAD[alg](KEYS[i])
      REFUND[alg](KEYS[i], st, now, tonumber(ARGV[a + 1]), tonumber(ARGV[a + 3]),
        tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5]), tonumber(ARGV[a + 2]))
    end
  else
    local states, all = {}, true
    for i = first + 1, first + n do
      local a = base + (i - 1) * 6
      local alg = tonumber(ARGV[a])
      local st, corrupt = LOAD[alg](KEYS[i])
      states[i] = st
      local ok, remaining, reset, retry = DECIDE[alg](st, now, tonumber(ARGV[a + 1]),
        tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5]))
      if not ok then
        all = false
      end
      local o = #out
      out[o + 1] = ok and 1 or 0
      out[o + 2] = remaining
      out[o + 3] = reset
      out[o + 4] = retry
      out[o + 5] = corrupt and 1 or 0
    end
    if all then
      for i = first + 1, first + n do
        local a = base + (i - 1) * 6
        APPLY[tonumber(ARGV[a])](KEYS[i], states[i], now, tonumber(ARGV[a + 1]),
          tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5]),
          tonumber(ARGV[a + 2]))
      end
    end
  end
  first = first + n
end
return out
