-- observe.lua — one shard's stock and version, read at one instant (the
-- reconciler's view of the shard).
--
-- KEYS: 1 stock  2 stream (one shard's slot)
-- ARGV: the positions (other than 0) of the SKUs placed on this shard, in
--       a sale of several SKUs (none otherwise)
-- Returns {stock or false, unsettled, version, {stock of ARGV[i] or false, …}}:
-- the stock (false when the shard's keys are gone), the settlement entries
-- not yet written to Postgres (XLEN), the shard's version: the id of the
-- last entry ever appended to its stream ("0-0" if none), and the stock of
-- each SKU asked for (KEYS[1] is position 0's).
--
-- Invariant: every script that moves a unit (grant_hold, release_hold in
-- _lib.lua) appends to the stream in the same script, so an unchanged
-- version means no unit moved and no hold came or went on this shard since
-- it was read. The reconciler compares Postgres with Redis only between two
-- equal versions, and reconcile.lua repairs only at the version it saw.

local stock = redis.call('GET', KEYS[1])
local unsettled = redis.call('XLEN', KEYS[2])
local skus = {}
for i, p in ipairs(ARGV) do
  skus[i] = redis.call('GET', stock_key(tonumber(p)))
end
return {stock, unsettled, stream_version(KEYS[2]), skus}
