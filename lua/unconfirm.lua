-- unconfirm.lua — undo a confirm whose Postgres transaction did not commit:
-- the hold is `held` again and back in the expiry index, so it is paid for
-- or expires (and its unit comes back) like any other hold.
--
-- KEYS: 1..7 the shard's keys (see _lib.lua; uses 2 holds, 3 exp)
-- ARGV: 1 hold id
-- Returns:
--   1  unconfirmed now (an expiry already past is taken by the next sweep
--      or on-demand reclaim)
--   0  nothing to undo: the hold is gone or not paid (a repeat changes nothing)
--
-- Invariant: the origin calls this only while it holds the reservation's
-- payment rows locked and Postgres says the reservation is not paid, so a
-- unit Postgres counts as sold is never put back in the expiry index.

local raw = redis.call('HGET', KEYS[2], ARGV[1])
if not raw then
  return 0
end
local h = cjson.decode(raw)
if h.s ~= 'paid' then
  return 0
end
h.s = 'held'
redis.call('HSET', KEYS[2], ARGV[1], cjson.encode(h))
redis.call('ZADD', KEYS[3], h.e, ARGV[1])
return 1
