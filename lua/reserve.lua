-- reserve.lua — one reservation attempt on the account's HOME shard.
--
-- KEYS: 1..7 the home shard's keys (see _lib.lua), 8 idempotency key
--       (`<shard>:idem:<hash(account, Idempotency-Key)>`, same slot).
-- ARGV: 1 account  2 qty  3 per-user limit  4 now_ms  5 hold_ms  6 hold id
--       7 this shard's index  8 sale id  9 idempotency ttl (s)
--       10 reclaim batch  11 number of shards
-- Returns {code, ...}:
--   {1, id, shard, expires_ms, qty}  HELD: a new hold on this shard
--   {2, id, shard, expires_ms, qty}  REPLAY: the key was used; the first answer
--   {3, id, qty}                     SPILL: this shard is empty; the account's
--                                    quota is reserved here under `id`; the
--                                    origin now tries the other shards (take.lua)
--   {4, id, qty}                     PENDING: replay of an unfinished spill: continue it
--   {5, used}                        LIMIT: qty would take the account over its limit
--   {6}                              EMPTY: nothing here and no other shard (sold out)
--   {7}                              UNINITIALIZED: the shard's keys are gone (Redis lost
--                                    data): refuse to sell blind
--
-- Invariants: (1) stock never goes below zero — units are granted only from
-- what `stock` holds; (2) the account's count on its home shard is raised by
-- every unit it holds or may hold (spill quota) BEFORE the unit is granted,
-- and the limit is checked against it, so the per-user limit holds across
-- shards; (3) a hold and its settlement record are written together;
-- (4) one Idempotency-Key gives one hold at most.
-- Partial fill: when fewer than qty units remain here, the rest are granted
-- (sell every unit); the answer carries the granted qty.

local prior = redis.call('GET', KEYS[8])
if prior then
  local p = cjson.decode(prior)
  if p.st == 'held' then
    return {2, p.id, p.sh, p.e, p.q}
  end
  return {4, p.id, p.q}
end

local acct, qty, limit = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local now, hold_ms, id, shard = tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6], tonumber(ARGV[7])
local used = tonumber(redis.call('HGET', KEYS[4], acct) or '0')
if used + qty > limit then
  return {5, used}
end

local stock = stock_for(qty, now, shard, tonumber(ARGV[10]))
if not stock then
  return {7}
end

if stock >= 1 then
  local q = math.min(stock, qty)
  redis.call('HINCRBY', KEYS[4], acct, q)
  local exp = grant_hold(id, acct, q, now, hold_ms, shard, shard, ARGV[8])
  redis.call('SET', KEYS[8], cjson.encode({st = 'held', id = id, sh = shard, e = exp, q = q}), 'EX', ARGV[9])
  return {1, id, shard, exp, q}
end

if tonumber(ARGV[11]) <= 1 then
  return {6}
end

redis.call('HINCRBY', KEYS[4], acct, qty)
redis.call('HSET', KEYS[5], id, cjson.encode({a = acct, q = qty}))
redis.call('SET', KEYS[8], cjson.encode({st = 'spill', id = id, q = qty}), 'EX', ARGV[9])
return {3, id, qty}
