-- take.lua — a spilled reservation tries one other shard.
--
-- KEYS: 1..7 this shard's keys (see _lib.lua), 8 decision marker for this hold
--       id on this shard (`<shard>:spill:<hold id>`, same slot).
-- ARGV: 1 account  2 qty (the quota counted on the home shard)  3 hold_ms
--       4 hold id  5 this shard's index  6 home shard index  7 sale id
--       8 marker ttl (s)  9 reclaim batch  10 idempotency hash
--       11 the SKU's position ('' in a one-SKU sale; the origin sends a
--       spill only to shards the SKU is placed on)
-- Returns:
--   {1, id, shard, expires_ms, qty}  HELD here (new, or the same hold again)
--   {6}                              EMPTY here, now and forever for this hold id
--                                    (markers live a day, shortened to minutes once
--                                    the spill is finished: Engine::retire_markers)
--   {7}                              UNINITIALIZED: keys lost
--   {8, id}                          GONE: this shard granted the hold earlier and it
--                                    has since been released (only said while the
--                                    shard is live: during a cold rebuild the marker
--                                    is restored before the holds, and the hold's
--                                    absence then means nothing: UNINITIALIZED)
--
-- Spill-over stays inside the SKU: the hold takes the units of the SKU it
-- was counted for at home (ARGV[11]), never another's.
--
-- Invariant: each shard decides ONCE per hold id (the marker), so however
-- many times, and however concurrently, a spill is replayed in the same
-- shard order, the first shard that said HELD is the only one that ever
-- does: one Idempotency-Key never yields two holds. The account's quota was
-- already counted on its home shard (reserve.lua), so no per-user check here;
-- the caller passes the quota's qty (never a replay's), so a hold is never
-- larger than what its home shard counted.

local id, shard = ARGV[4], tonumber(ARGV[5])
local decided = redis.call('GET', KEYS[8])
if decided == 'E' then
  return {6}
end
if decided == 'H' then
  local raw = redis.call('HGET', KEYS[2], id)
  if not raw then
    if redis.call('EXISTS', KEYS[1]) == 0 then
      return {7}
    end
    return {8, id}
  end
  local h = cjson.decode(raw)
  return {1, id, shard, h.e, h.q}
end

local qty, now, pos = tonumber(ARGV[2]), now_ms(), position_arg(ARGV[11])
local stock = stock_for(qty, now, shard, tonumber(ARGV[9]), pos)
if not stock then
  return {7}
end
if stock >= 1 then
  local q = math.min(stock, qty)
  local exp = grant_hold(id, ARGV[1], q, now, tonumber(ARGV[3]), tonumber(ARGV[6]), ARGV[7], ARGV[10], qty, pos)
  redis.call('SET', KEYS[8], 'H', 'EX', ARGV[8])
  return {1, id, shard, exp, q}
end
redis.call('SET', KEYS[8], 'E', 'EX', ARGV[8])
return {6}
