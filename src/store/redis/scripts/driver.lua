-- tollgate: the driver. Runs groups of limits; each group is decided all-or-nothing.
--
-- KEYS[i]  the state key of limit i (all groups' limits, in order).
-- ARGV[1]  'b' for a batch of single-limit checks at the server's time (the batcher's common
--          call): then ARGV[1 + i] is limit i's cost, or "index:cost" for a limit other than
--          the store's first, and nothing else follows. Otherwise 'c' to check: decide every
--          limit of a group, then charge all of them only if all allow (a rejected group writes
--          nothing); or 'r' to refund what a check charged. For 'c' and 'r':
-- ARGV[2]  G, the number of groups. Then one header per group: '' for the common group of one
--          limit at the server's time, else "n" (n limits) or "n@t" (at time t in µs). TIME is
--          read once, shared by every group at the server's time. A refund's header adds "rA",
--          the time A (µs) its reservation was charged at ("nrA" or "n@trA"); the refund itself
--          is applied at t (or the server's time), so the buckets can tell what refilled since.
-- Then 2 arguments per limit, in KEYS order: the limit's index in this store's configuration
-- and the cost. LIMIT (generated from the configuration) maps an index to the algorithm's
-- functions (load, decide, apply, refund, and check, decide-then-apply in one call where the
-- algorithm has it, else false) and the limit's ttl_ms and parameters p1..p3.
--
-- Returns one string of little-endian 64-bit integers (cheaper to build and to parse than an
-- array reply): per group (for 'b': once) the time, then 5 integers per limit: allowed (1/0), remaining,
-- reset (µs), retry (µs; -1 when the cost exceeds the capacity) and corrupt (1 when the key held
-- something unreadable, which was deleted and treated as a fresh key). When a group is
-- rejected, its limits that would have allowed are reported as they stand, at cost 0 (as the
-- memory store does); a refund reports each limit after the refund, at cost 0, at the refund's
-- time.
local refund = ARGV[1] == 'r'
local out, nout = {}, 0 -- packed pieces of the reply
local server_now

-- Appends one limit's five integers.
local function emit(ok, remaining, reset, retry, corrupt)
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
  nout = nout + 1
  out[nout] = struct.pack('<i8i8i8i8i8', ok and 1 or 0, remaining, reset, retry, corrupt and 1 or 0)
end


-- One limit on its own (the common case): no tables, small numbers without strtod. Returns the
-- five packed integers.
local function single(key, lim, cost, now, at)
  local load, decide, apply, give_back, check, ttl, p1, p2, p3 = LIMIT(lim)
  local corrupt, s1, s2, s3 = load(key)
  local ok, remaining, reset, retry
  if refund then
    s1, s2, s3 = give_back(key, ttl, at, now, cost, p1, p2, p3, s1, s2, s3)
    ok, remaining, reset, retry = decide(now, 0, p1, p2, p3, s1, s2, s3)
  elseif check then
    ok, remaining, reset, retry = check(key, ttl, now, cost, p1, p2, p3, s1, s2, s3)
  else
    ok, remaining, reset, retry = decide(now, cost, p1, p2, p3, s1, s2, s3)
    if ok then
      apply(key, ttl, now, cost, p1, p2, p3, s1, s2, s3)
    end
  end
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
  return struct.pack('<i8i8i8i8i8', ok and 1 or 0, remaining, reset, retry, corrupt and 1 or 0)
end

if ARGV[1] == 'b' then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  out[1] = struct.pack('<i8', now)
  for i = 1, #KEYS do
    local arg, lim, cost = ARGV[i + 1], 0, 1
    if arg ~= '1' then
      local l, c = string.match(arg, '^(%d+):(%d+)$')
      if l then
        lim, cost = tonumber(l), tonumber(c)
      else
        cost = tonumber(arg)
      end
    end
    out[i + 1] = single(KEYS[i], lim, cost, now)
  end
  return table.concat(out)
end

local ngroups = int(ARGV[2])
local base = 3 + ngroups
local first = 0
for g = 1, ngroups do
  local n, now, at = 1, '', ''
  local header = ARGV[2 + g]
  if header ~= '' then
    n, now, at = string.match(header, '^(%d+)@?(%d*)r?(%d*)$')
    n = tonumber(n)
  end
  if now ~= '' then
    now = tonumber(now)
  else
    if server_now == nil then
      local t = redis.call('TIME')
      server_now = tonumber(t[1]) * 1000000 + tonumber(t[2])
    end
    now = server_now
  end
  if at ~= '' then
    at = tonumber(at)
  else
    at = now
  end
  if n == 1 then
    local a = base + 2 * first
    local lim, cost = ARGV[a], ARGV[a + 1]
    if lim == '0' then
      lim = 0
    else
      lim = tonumber(lim)
    end
    if cost == '1' then
      cost = 1
    else
      cost = tonumber(cost)
    end
    nout = nout + 1
    out[nout] = struct.pack('<i8', now)
    nout = nout + 1
    out[nout] = single(KEYS[first + 1], lim, cost, now, at)
  else
    nout = nout + 1
    out[nout] = struct.pack('<i8', now)
    -- Decide every limit, then charge all of them or none. The state (up to three values per
    -- limit) is kept for the second pass.
    local lims, costs, s1s, s2s, s3s, oks, corrupts, at = {}, {}, {}, {}, {}, {}, {}, nout
    local all = true
    for j = 1, n do
      local a = base + 2 * (first + j - 1)
      local lim, cost = int(ARGV[a]), int(ARGV[a + 1])
      local load, decide, _, give_back, _, ttl, p1, p2, p3 = LIMIT(lim)
      local key = KEYS[first + j]
      local corrupt, s1, s2, s3 = load(key)
      if refund then
        s1, s2, s3 = give_back(key, ttl, at, now, cost, p1, p2, p3, s1, s2, s3)
        cost = 0
      end
      local ok, remaining, reset, retry = decide(now, cost, p1, p2, p3, s1, s2, s3)
      lims[j], costs[j], oks[j], corrupts[j] = lim, cost, ok, corrupt
      s1s[j], s2s[j], s3s[j] = s1, s2, s3
      all = all and ok
      emit(ok, remaining, reset, retry, corrupt)
    end
    if not refund then
      if all then
        for j = 1, n do
          local _, _, apply, _, _, ttl, p1, p2, p3 = LIMIT(lims[j])
          apply(KEYS[first + j], ttl, now, costs[j], p1, p2, p3, s1s[j], s2s[j], s3s[j])
        end
      else
        -- Nothing is charged: report the limits that would have allowed as they stand (cost 0).
        local after = nout
        for j = 1, n do
          if oks[j] then
            local _, decide, _, _, _, _, p1, p2, p3 = LIMIT(lims[j])
            nout = at + j - 1
            local ok, remaining, reset, retry = decide(now, 0, p1, p2, p3, s1s[j], s2s[j], s3s[j])
            emit(ok, remaining, reset, retry, corrupts[j])
          end
        end
        nout = after
      end
    end
  end
  first = first + n
end
return table.concat(out)
