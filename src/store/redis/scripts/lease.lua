-- tollgate: the lease driver of the hybrid store (src/store/hybrid), run in place of driver.lua
-- after the prelude, the batch constants and the lead (which a lease call passes untouched: its
-- ARGV[1] is a limit's index), the state helpers, the algorithms, CONFIG and the dispatch, so a
-- lease runs exactly the
-- functions a check runs. Leasing `n` units is a check of cost `n` at one instant:
-- `decide(now, 0)` says how many fit, `apply` charges them. Its arguments (the state key and its
-- birth record; limit, want, min[:wait], give, given_at, owed, now, known, known_at, known_until)
-- and its reply are described in docs/internals/redis-script.md, "The lease call".
local lim = tonumber(ARGV[1])
local want = tonumber(ARGV[2])
local min, wait = string.match(ARGV[3], '^(%d+):?(%d*)$')
min = tonumber(min)
if wait == '' then
  wait = min
else
  wait = tonumber(wait)
end
local give = tonumber(ARGV[4])
local given_at = tonumber(ARGV[5])
local owed = tonumber(ARGV[6])
local now
if ARGV[7] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[7])
end
local known = tonumber(ARGV[8])
local known_at = tonumber(ARGV[9])
local known_until = tonumber(ARGV[10])
if known_at > now then
  known_at = now
end
local key = KEYS[1]
local born_key = KEYS[2]
local load, decide, apply, give_back, _, ttl, p1, p2, p3 = LIMIT(lim)
local recharge = known > 0 and (known_until == 0 or now < known_until)
local missing = redis.call('EXISTS', key) == 0
local corrupt, s1, s2, s3, o1 = load(key)
if o1 then
  return struct.pack('<i8i8i8i8i8i8', now, -2, 0, 0, 0, 0)
end
-- What a key charged `units` at `at` from nothing leaves at `now`, worked out in the birth
-- record's key (the caller restores the record).
local function left_after(units, at)
  if units == 0 then
    local _, l = decide(now, 0, p1, p2, p3, 0, 0, 0)
    return l
  end
  apply(born_key, ttl, at, units, p1, p2, p3, 0, 0, 0)
  local _, k1, k2, k3 = load(born_key)
  local _, l = decide(now, 0, p1, p2, p3, k1, k2, k3)
  return l
end
-- A caller that knew what the key spent, finding it started over since its last reply, leases
-- only its cost: other instances may know more, and their next calls charge it. Its own next
-- call, informed by this reply, leases as usual.
local cost_only = false
if missing or corrupt then
  local base, base_at = 0, now
  if recharge then
    apply(key, ttl, known_at, known, p1, p2, p3, s1, s2, s3)
    local _
    _, s1, s2, s3 = load(key)
    base, base_at = known, known_at
    cost_only = true
  end
  redis.call('SET', born_key, struct.pack('<i8i8i8', now, base, base_at), 'PX', ttl)
elseif recharge then
  local b = redis.call('GET', born_key)
  if type(b) == 'string' and #b == 24 then
    local born, base, base_at = struct.unpack('<i8i8i8', b)
    if born > known_at then
      -- The key was rebuilt with `base` (the most a caller knew so far). If this caller knew
      -- more, the key is rebuilt again as it knew it, charged at its time (so the algorithm
      -- refills it, and a sliding window counter weighs it, as it would have), plus what was
      -- spent since the key started over (what it has less than its base leaves now), charged
      -- now; this caller's knowledge becomes the base.
      local had = left_after(base, base_at)
      if had - left_after(known, known_at) > 0 then
        local _, avail_now = decide(now, 0, p1, p2, p3, s1, s2, s3)
        local since = had - avail_now
        apply(key, ttl, known_at, known, p1, p2, p3, 0, 0, 0)
        _, s1, s2, s3 = load(key)
        if since > 0 then
          apply(key, ttl, now, since, p1, p2, p3, s1, s2, s3)
          _, s1, s2, s3 = load(key)
        end
        base, base_at = known, known_at
      end
      redis.call('SET', born_key, struct.pack('<i8i8i8', born, base, base_at), 'PX', ttl)
      cost_only = true
    end
  end
end
if cost_only and want > min then
  want = min
end
if give > 0 then
  s1, s2, s3 = give_back(key, ttl, given_at, now, give, p1, p2, p3, s1, s2, s3)
end
if owed > 0 then
  local _, avail = decide(now, 0, p1, p2, p3, s1, s2, s3)
  if owed > avail then
    owed = avail
  end
  if owed > 0 then
    apply(key, ttl, now, owed, p1, p2, p3, s1, s2, s3)
    local _
    _, s1, s2, s3 = load(key)
  end
end
local _, avail = decide(now, 0, p1, p2, p3, s1, s2, s3)
local grant = want
if grant > avail then
  grant = avail
end
if grant >= min and grant > 0 then
  local ok, remaining, reset = decide(now, grant, p1, p2, p3, s1, s2, s3)
  if ok then
    apply(key, ttl, now, grant, p1, p2, p3, s1, s2, s3)
    return struct.pack('<i8i8i8i8i8i8', now, grant, remaining, reset, 0, corrupt and 1 or 0)
  end
end
local _, remaining, reset, retry = decide(now, min, p1, p2, p3, s1, s2, s3)
if retry ~= -1 and wait > min then
  local _, _, _, later = decide(now, wait, p1, p2, p3, s1, s2, s3)
  if later ~= -1 and later > retry then
    retry = later
  end
end
local _, left, until_full, wait_for, unread = decided(false, remaining, reset, retry, corrupt)
return struct.pack('<i8i8i8i8i8i8', now, 0, left, until_full, wait_for, unread)
