-- tollgate: the token bucket's fused batch check, tb_fast (parameters as in token_bucket.lua:
-- p1 = unit, p2 = per, p3 = cap). Run before anything else is defined when limit 0 is a token
-- bucket (see lead.lua), so it uses only the prelude.

-- A batch's common decision in one call: a check of cost 1 at the limit's own parameters of a key
-- whose state `v` the batch read ahead (16 bytes, unmarked; false: no string there; nil: not read
-- ahead). When it allows, it writes the state and returns the reply's compact record, -1 - deficit
-- after the charge: the store derives remaining (floor((cap - deficit) / unit)) and reset
-- (ceil(deficit / per)) from it (`CompactForm` in script.rs), so the script packs one integer
-- instead of five. A key with no string is a fresh key when nothing is there (`SET ... NX`);
-- anything else (a key of another type, marked or unreadable state, a carried deficit or a lock, a
-- rejection) returns nil, having touched nothing, and the general path decides it. `from`, the
-- start of the cell holding `now` (µs; the batch works it out once), and `keep` (µs) decide when
-- the write keeps the key's TTL: see "Expiry" in token_bucket.lua (`last` is in now's cell exactly
-- when from <= last <= now; the reset, ceil(after / per), is at most `keep` exactly when after <=
-- keep × per; a product past 2^53 only exceeds `after`). A write that does not keep the TTL is
-- tb_store's for this state (`last` = `now`): `PX ttl`.
local function tb_fast(key, v, ttl, now, unit, per, cap, from, keep)
  if not v then
    if v == nil then
      return nil -- not read ahead
    end
    -- A fresh bucket: full, so one unit leaves unit missing (cap >= unit: a burst of 1 at least).
    if redis_call('SET', key, struct_pack('<i8i8', unit, now), 'NX', 'PX', ttl) then
      return -1 - unit
    end
    return nil
  end
  if #v ~= 16 then
    return nil
  end
  local deficit, last = struct_unpack('<i8i8', v)
  if deficit < 0 or deficit > cap or last < 0 or last > now then
    return nil -- unreadable, a deficit carried from a larger quota, or a lock
  end
  if now > last then
    deficit = deficit - (now - last) * per
    if deficit < 0 then
      deficit = 0
    end
  end
  local after = deficit + unit
  if after > cap then
    return nil
  end
  if last >= from and after <= keep * per then
    redis_call('SET', key, struct_pack('<i8i8', after, now), 'KEEPTTL')
  else
    redis_call('SET', key, struct_pack('<i8i8', after, now), 'PX', ttl)
  end
  return -1 - after
end
