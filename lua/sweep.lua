-- sweep.lua — the periodic expiry sweep of one shard.
--
-- KEYS: 1..7 the shard's keys (see _lib.lua)
-- ARGV: 1 this shard's index  2 batch size
-- Returns {units returned, holds still expired after this batch}
--
-- Invariant: a hold past its expiry is returned exactly once, with its
-- release record, whether the sweep or a reservation's on-demand reclaim
-- (reserve.lua / take.lua) gets to it first.

local now = now_ms()
local units = reclaim_expired(now, tonumber(ARGV[1]), tonumber(ARGV[2]))
return {units, redis.call('ZCOUNT', KEYS[3], '-inf', now)}
