-- sweep.lua — the periodic expiry sweep of one shard.
--
-- KEYS: 1..7 the shard's keys (see _lib.lua)
-- ARGV: 1 now_ms  2 this shard's index  3 batch size
-- Returns {units returned, holds still expired after this batch}
--
-- Invariant: a hold past its expiry is returned exactly once, with its
-- release record, whether the sweep or a reservation's on-demand reclaim
-- (reserve.lua / take.lua) gets to it first.

local now = tonumber(ARGV[1])
local units = reclaim_expired(now, tonumber(ARGV[2]), tonumber(ARGV[3]))
return {units, redis.call('ZCOUNT', KEYS[3], '-inf', now)}
