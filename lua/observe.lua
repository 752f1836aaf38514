-- observe.lua — one shard's stock and version, read at one instant (the
-- reconciler's view of the shard).
--
-- KEYS: 1 stock  2 stream (one shard's slot)
-- ARGV: none
-- Returns {stock or false, unsettled, version}: the stock (false when the
-- shard's keys are gone), the settlement entries not yet written to
-- Postgres (XLEN), and the shard's version: the id of the last entry ever
-- appended to its stream ("0-0" if none).
--
-- Invariant: every script that moves a unit (grant_hold, release_hold in
-- _lib.lua) appends to the stream in the same script, so an unchanged
-- version means no unit moved and no hold came or went on this shard since
-- it was read. The reconciler compares Postgres with Redis only between two
-- equal versions, and reconcile.lua repairs only at the version it saw.

local stock = redis.call('GET', KEYS[1])
local unsettled = redis.call('XLEN', KEYS[2])
return {stock, unsettled, stream_version(KEYS[2])}
