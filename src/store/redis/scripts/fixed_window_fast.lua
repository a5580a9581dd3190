-- tollgate: the fixed window's fused batch check, fw_fast (parameters as in fixed_window.lua:
-- p1 = P, p2 = L, p3 = 0 for epoch windows). Run before anything else is defined when limit 0
-- is a fixed window of epoch windows (see lead.lua), so it uses only the prelude.

-- A batch's common decision in one call, for epoch windows: a check of cost 1 at the limit's own
-- parameters of a key whose state `v` the batch read ahead (16 bytes, unmarked; false: no string
-- there; nil: not read ahead). When it allows, it writes the state and returns the reply's compact
-- record, -1 - the window's count after the charge: the store derives remaining (limit - count) and
-- reset (to the end of the window holding `now`) from it (`CompactForm` in script.rs). A window
-- already spent is refused with the record -1 (a count of 0: remaining 0, reset and retry at the
-- window's end), writing nothing. A key with no string is a fresh key when nothing is there (`SET
-- ... NX`). Returns nil, having touched nothing, for anything else (a key of another type, marked
-- or unreadable state, a later window, a limit of 0): the general path decides it.
-- Expiry: a write that opens a window sets the key's TTL as fw_apply does (the limit's ttl, or
-- the window's end when that is later); a later write in the same window keeps it (`KEEPTTL`),
-- as every write that left the key in this window set a TTL reaching the window's end. Once the
-- window has ended the key reads as a fresh one would, whether it is there or not.
-- `from` is the start of the window holding `now` (for epoch windows FAST_CELL is the period,
-- and the batch works out the cell's start once), a multiple of `period`, so
-- `from / period` is that window's index, exactly.
local function fw_fast(key, v, ttl, now, period, limit, _, from)
  local w = from / period
  local nx
  if v then
    if #v ~= 16 then
      return nil
    end
    local window, count = struct_unpack('<i8i8', v)
    if out_of_range(window) or out_of_range(count) then
      return nil
    end
    if window == w then
      if count >= limit then
        return -1 -- refused until the window ends; nothing is written
      end
      count = count + 1
      redis_call('SET', key, struct_pack('<i8i8', w, count), 'KEEPTTL')
      return -1 - count
    end
    if window > w then
      return nil
    end
  elseif v == nil then
    return nil -- not read ahead
  else
    nx = 'NX'
  end
  if limit < 1 then
    return nil
  end
  -- The window's first unit: alive at least until the window ends.
  local e = cdiv(from + period - now, 1000)
  if e > tonumber(ttl) then
    ttl = ttl_digits(e)
  end
  local packed = struct_pack('<i8i8', w, 1)
  if nx then
    if not redis_call('SET', key, packed, 'NX', 'PX', ttl) then
      return nil
    end
  else
    redis_call('SET', key, packed, 'PX', ttl)
  end
  return -2
end
