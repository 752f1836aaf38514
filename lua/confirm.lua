-- confirm.lua — a payment succeeded: the hold becomes a sale in Redis, so
-- expiry can no longer give its unit back.
--
-- KEYS: 1..7 the shard's keys (see _lib.lua; uses 2 holds, 3 exp)
-- ARGV: 1 hold id  2 force ("1": confirm even past its expiry — only to
--       re-align a hold Postgres already records as paid, while the origin
--       holds its reservation and payment rows locked; absent or "0" otherwise)
-- Returns:
--   1  confirmed now, or already confirmed (a repeat changes nothing)
--   0  too late: the hold is gone or past its expiry (the unit is, or is
--      about to be, back on sale) — the payment must be refunded
--
-- Invariant: a unit is never both sold and back on sale — a hold past its
-- expiry is never confirmed (except forced, when Postgres already sold it and
-- the hold is still here, so its unit never came back), and a confirmed hold
-- leaves the expiry index.

local raw = redis.call('HGET', KEYS[2], ARGV[1])
if not raw then
  return 0
end
local h = cjson.decode(raw)
if h.s == 'paid' then
  return 1
end
if ARGV[2] ~= '1' and tonumber(h.e) <= now_ms() then
  return 0
end
h.s = 'paid'
redis.call('HSET', KEYS[2], ARGV[1], cjson.encode(h))
redis.call('ZREM', KEYS[3], ARGV[1])
return 1
