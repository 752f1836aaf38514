-- paid_holds.lua — the reconciler's cheap look at one shard's paid holds:
-- how many holds Redis has as paid, and the records of the holds Postgres
-- has as paid, read at one instant.
--
-- KEYS: 1 holds  2 exp (one shard's slot)
-- ARGV: the ids of the reservations Postgres has `paid` on this shard (a
--       chunk of them)
-- Returns {paid, {rec1, rec2, …}}: `paid` = HLEN(holds) − ZCARD(exp), and
-- each id's hold record in ARGV's order (nil when the shard has none).
--
-- Invariant used (kept by every script that writes a hold): a hold record
-- is in `exp` exactly while it is not paid — grant_hold and unconfirm.lua
-- add it, confirm.lua and restore.lua remove it, release_hold removes both,
-- rebuild.lua adds only the unpaid ones. So `paid` counts the holds Redis
-- has as paid without reading them. When the ids Postgres has as paid
-- account for all of them, no hold is paid in Redis alone and the reconciler
-- need not scan every hold record of the shard (10^6 on a big sale); when
-- they do not, it scans (origin/src/reconcile.rs, check_hold_states).
-- An id in `exp` without a hold record would make the count one short and
-- could hide a hold paid in Redis alone; no script leaves one (release_hold
-- removes both), and reclaim_expired drops one it meets once it is due, so
-- such a miss would last until then, not for good.

local paid = redis.call('HLEN', KEYS[1]) - redis.call('ZCARD', KEYS[2])
local recs = {}
for i, id in ipairs(ARGV) do
  recs[i] = redis.call('HGET', KEYS[1], id) or false
end
return {paid, recs}
