-- tollgate: the driver, the script's entry point for checks and refunds. Runs groups of limits;
-- each group is decided all-or-nothing. Its arguments ('b', 'c', 'r', 'n' first), headers
-- ("n@trA") and reply are described in docs/internals/redis-script.md, "The check call".
local KEYS, ARGV = KEYS, ARGV
local node = ARGV[1] == 'n'
if node then
  local nkeys = tonumber(ARGV[2])
  local keys, argv = {}, {}
  for i = 1, nkeys do
    keys[i] = ARGV[2 + i]
  end
  for i = 3 + nkeys, #ARGV do
    argv[i - 2 - nkeys] = ARGV[i]
  end
  KEYS, ARGV = keys, argv
  -- The reads double as the batch's read-ahead (PREFETCH; a sliding log is read in pieces, so
  -- then the keys are only checked).
  local seen = {}
  for i = 1, nkeys do
    local key = keys[i]
    if not seen[key] then
      seen[key] = true
      local v
      if PREFETCH then
        v = redis.pcall('GET', key)
      else
        v = redis.pcall('EXISTS', key)
      end
      if type(v) == 'table' and v.err and string.sub(v.err, 1, 9) ~= 'WRONGTYPE' then
        return redis.error_reply('TOLLGATE_UNSERVED ' .. v.err)
      end
      if PREFETCH and type(v) == 'string' then
        PREFETCHED[key] = v
      end
    end
  end
end
local refund = ARGV[1] == 'r'
local out, nout = {}, 0 -- packed pieces of the reply
local server_now

-- "index:ttl:p1:p2:p3": the limit's index and the plan's ttl_ms and parameters. The ttl stays
-- the digits it came as (it only goes to PX, as in LIMIT), without leading zeros.
local function plan_arg(s)
  local i, ttl, a, b, c = string.match(s, '^(%d+):0*(%d+):(%d+):(%d+):(%d+)$')
  if i == nil or ttl == '0' then
    error('tollgate: malformed limit argument ' .. s)
  end
  return tonumber(i), { ttl, tonumber(a), tonumber(b), tonumber(c) }
end

-- A check at `plan` (ttl_ms and parameters; nil: the limit's own, ttl, p1..p3) of a key whose
-- state (s1..s3) was written at o1..o3 (its mark; nil: the limit's own parameters). Sets MARK
-- for the writes that follow, rebases the state (`Algorithm::rebase`, mirrored by each algorithm's
-- `_rebase`) if it was written at other parameters, and returns the check's ttl, parameters and
-- state, and whether it was rebased. The rebased state is not stored here: only a check that
-- charges something stores it (its apply writes it, marked); a check of cost 0, or a rejected
-- one, writes nothing, so the key keeps the state it was written at, and a change back finds it
-- whole (as the memory store does). A refund stores what it gives back to.
local function replan(key, lim, plan, now, ttl, p1, p2, p3, s1, s2, s3, o1, o2, o3)
  local n1, n2, n3 = p1, p2, p3
  if plan then
    ttl, n1, n2, n3 = plan[1], plan[2], plan[3], plan[4]
  end
  if n1 == p1 and n2 == p2 and n3 == p3 then
    MARK = ''
  else
    MARK = struct.pack('<i8i8i8', n1, n2, n3)
  end
  if o1 == nil then
    o1, o2, o3 = p1, p2, p3
  end
  -- A missing key (all zeros: a fresh key at any parameters) has nothing to carry.
  local rebased = false
  if (o1 ~= n1 or o2 ~= n2 or o3 ~= n3) and (s1 ~= 0 or s2 ~= 0 or (s3 or 0) ~= 0) then
    s1, s2, s3 = REBASE(lim)(key, ttl, now, o1, o2, o3, n1, n2, n3, s1, s2, s3)
    rebased = true
  end
  return ttl, n1, n2, n3, s1, s2, s3, rebased
end

-- One limit on its own (the common case): no tables, small numbers without strtod. Returns its
-- five integers.
local function single(key, lim, cost, now, at, plan)
  local load, decide, apply, give_back, check, ttl, p1, p2, p3 = LIMIT(lim)
  local corrupt, s1, s2, s3, o1, o2, o3 = load(key)
  local rebased = false
  if plan or o1 then
    ttl, p1, p2, p3, s1, s2, s3, rebased =
      replan(key, lim, plan, now, ttl, p1, p2, p3, s1, s2, s3, o1, o2, o3)
  end
  local ok, remaining, reset, retry
  if refund then
    s1, s2, s3 = give_back(key, ttl, at, now, cost, p1, p2, p3, s1, s2, s3)
    ok, remaining, reset, retry = decide(now, 0, p1, p2, p3, s1, s2, s3)
  elseif rebased and cost == 0 then
    -- Charges nothing: the key keeps the state it was written at.
    ok, remaining, reset, retry = decide(now, 0, p1, p2, p3, s1, s2, s3)
  elseif check then
    ok, remaining, reset, retry = check(key, ttl, now, cost, p1, p2, p3, s1, s2, s3)
  else
    ok, remaining, reset, retry = decide(now, cost, p1, p2, p3, s1, s2, s3)
    if ok then
      apply(key, ttl, now, cost, p1, p2, p3, s1, s2, s3)
    end
  end
  MARK = ''
  return decided(ok, remaining, reset, retry, corrupt)
end

-- A batch: 'b' (each key's argument follows) or 'B' (every key distinct, of limit 0 at cost 1:
-- no argument per key). The reply is the time, then per key a compact record (one negative
-- integer, from limit 0's FAST) or five integers, packed at the end (pack_ints). A 'B' batch the
-- lead (lead.lua) began continues from its key LEAD_NEXT.
local kind = ARGV[1]
if kind == 'b' or kind == 'B' then
  local each = kind == 'B'
  local now, from, ints, m, start = LEAD_NOW, LEAD_FROM, LEAD_INTS, LEAD_NEXT, LEAD_NEXT
  if not start then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000000 + tonumber(t[2])
    ints, m, start = { now }, 1, 1
    -- The start of the cell holding `now` (FAST_CELL µs; "Expiry" in token_bucket.lua), once
    -- for the batch rather than once per key.
    from = 0
    if FAST then
      from = idiv(now, FAST_CELL) * FAST_CELL
    end
  end
  -- One MGET instead of a GET per decision when every limit keeps its state in one short string
  -- (PREFETCH: no sliding log, whose log is read in pieces). A redis.call costs more than the
  -- read itself. 'B' takes each key's value by its index (its keys are distinct); 'b' leaves
  -- them in PREFETCHED (see read_state for how each is taken), as a key may come twice.
  local values = LEAD_VALUES
  if not values and PREFETCH and not node and (each or #KEYS > 1) then
    values = redis.call('MGET', unpack(KEYS))
    if not each then
      for i = 1, #KEYS do
        local v = values[i]
        if v then
          PREFETCHED[KEYS[i]] = v
        end
      end
    end
  end
  local direct = each and values
  if direct and FAST then
    -- A 'B' batch read ahead, with limit 0's fused check: each key by its index, the rest of the
    -- loop below (what FAST leaves) inlined, as this loop runs once per decision.
    -- The key the lead stopped at (LEAD_NEXT) goes straight to the general path.
    local fast, ttl, p1, p2, p3, keep = FAST, FAST_TTL, FAST_P1, FAST_P2, FAST_P3, FAST_KEEP
    local left = LEAD_NEXT
    for i = start, #KEYS do
      local v = values[i]
      local r = i ~= left and fast(KEYS[i], v, ttl, now, p1, p2, p3, from, keep)
      if r then
        m = m + 1
        ints[m] = r
      else
        if v then
          PREFETCHED[KEYS[i]] = v
        end
        ints[m + 1], ints[m + 2], ints[m + 3], ints[m + 4], ints[m + 5] =
          single(KEYS[i], 0, 1, now, now, nil)
        m = m + 5
      end
    end
    return pack_ints(ints, m)
  end
  for i = start, #KEYS do
    local key, arg = KEYS[i], '1'
    if not each then
      arg = ARGV[i + 1]
    end
    -- The common case (limit 0, cost 1, state read ahead) in one call, when limit 0 has it.
    local r
    if FAST and arg == '1' then
      local v
      if direct then
        v = values[i]
      else
        v = PREFETCHED[key]
      end
      r = FAST(key, v, FAST_TTL, now, FAST_P1, FAST_P2, FAST_P3, from, FAST_KEEP)
      if r and not direct then
        PREFETCHED[key] = nil
      end
    end
    if r then
      m = m + 1
      ints[m] = r
    else
      local lim, cost, plan = 0, 1, nil
      if arg ~= '1' then
        local l, c = string.match(arg, '^(%d+):(%d+)$')
        if l then
          lim, cost = tonumber(l), tonumber(c)
        else
          cost = tonumber(arg)
          if cost == nil then
            -- A plan: "index:cost:ttl:p1:p2:p3".
            local rest
            l, c, rest = string.match(arg, '^(%d+):(%d+):(.*)$')
            local _, p = plan_arg('0:' .. (rest or ''))
            lim, cost, plan = tonumber(l), tonumber(c), p
          end
        end
      end
      if direct and values[i] then
        PREFETCHED[key] = values[i]
      end
      ints[m + 1], ints[m + 2], ints[m + 3], ints[m + 4], ints[m + 5] =
        single(key, lim, cost, now, now, plan)
      m = m + 5
    end
  end
  return pack_ints(ints, m)
end

-- Appends one limit's five integers.
local function emit(ok, remaining, reset, retry, corrupt)
  nout = nout + 1
  out[nout] = struct.pack('<i8i8i8i8i8', decided(ok, remaining, reset, retry, corrupt))
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
    local lim, cost, plan = ARGV[a], ARGV[a + 1], nil
    if lim == '0' then
      lim = 0
    else
      local l = tonumber(lim)
      if l == nil then
        l, plan = plan_arg(lim)
      end
      lim = l
    end
    if cost == '1' then
      cost = 1
    else
      cost = tonumber(cost)
    end
    nout = nout + 1
    out[nout] = struct.pack('<i8', now)
    nout = nout + 1
    out[nout] = struct.pack('<i8i8i8i8i8', single(KEYS[first + 1], lim, cost, now, at, plan))
  else
    nout = nout + 1
    out[nout] = struct.pack('<i8', now)
    -- Decide every limit, then charge all of them or none. The state (up to three values per
    -- limit), parameters and mark are kept for the second pass.
    local lims, costs, s1s, s2s, s3s, oks, corrupts, pos = {}, {}, {}, {}, {}, {}, {}, nout
    local params, marks, rebaseds = {}, {}, {}
    local all = true
    for j = 1, n do
      local a = base + 2 * (first + j - 1)
      local lim, cost, plan = int(ARGV[a]), int(ARGV[a + 1]), nil
      if lim == nil then
        lim, plan = plan_arg(ARGV[a])
      end
      local load, decide, _, give_back, _, ttl, p1, p2, p3 = LIMIT(lim)
      local key = KEYS[first + j]
      local corrupt, s1, s2, s3, o1, o2, o3 = load(key)
      local rebased = false
      if plan or o1 then
        ttl, p1, p2, p3, s1, s2, s3, rebased =
          replan(key, lim, plan, now, ttl, p1, p2, p3, s1, s2, s3, o1, o2, o3)
      end
      rebaseds[j] = rebased
      if refund then
        s1, s2, s3 = give_back(key, ttl, at, now, cost, p1, p2, p3, s1, s2, s3)
        cost = 0
      end
      marks[j], MARK = MARK, ''
      local ok, remaining, reset, retry = decide(now, cost, p1, p2, p3, s1, s2, s3)
      lims[j], costs[j], oks[j], corrupts[j] = lim, cost, ok, corrupt
      s1s[j], s2s[j], s3s[j] = s1, s2, s3
      params[j] = { ttl, p1, p2, p3 }
      all = all and ok
      emit(ok, remaining, reset, retry, corrupt)
    end
    if not refund then
      if all then
        for j = 1, n do
          -- A rebased state charged nothing is not stored (see `replan`).
          if costs[j] > 0 or not rebaseds[j] then
            local _, _, apply = LIMIT(lims[j])
            local p = params[j]
            MARK = marks[j]
            apply(KEYS[first + j], p[1], now, costs[j], p[2], p[3], p[4], s1s[j], s2s[j], s3s[j])
          end
        end
        MARK = ''
      else
        -- Nothing is charged: report the limits that would have allowed as they stand (cost 0).
        local after = nout
        for j = 1, n do
          if oks[j] then
            local _, decide = LIMIT(lims[j])
            local p = params[j]
            nout = pos + j - 1
            local ok, remaining, reset, retry = decide(now, 0, p[2], p[3], p[4], s1s[j], s2s[j], s3s[j])
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
