-- quota_commit.lua — a spill found its units: record where, on the home shard.
--
-- KEYS: 1 users  2 quota  3 idempotency key (all on the account's home shard)
-- ARGV: 1 account  2 hold id  3 granted qty  4 shard that holds it
--       5 expires_ms  6 idempotency ttl (s)  7 the qty the request asked for
-- Returns 1 when recorded, 0 when it already was (a concurrent replay).
--
-- Invariant: the account's count equals the units it actually holds — when a
-- shard granted fewer units than the quota reserved (partial fill), the
-- difference is given back here, once.

local prior = redis.call('GET', KEYS[3])
if prior then
  local p = cjson.decode(prior)
  if p.st == 'held' or p.id ~= ARGV[2] then
    return 0
  end
end
local granted = tonumber(ARGV[3])
local raw = redis.call('HGET', KEYS[2], ARGV[2])
if raw then
  local qr = cjson.decode(raw)
  if qr.q > granted then
    redis.call('HINCRBY', KEYS[1], ARGV[1], granted - qr.q)
  end
  redis.call('HSET', KEYS[2], ARGV[2], cjson.encode({a = qr.a, q = granted, s = tonumber(ARGV[4])}))
end
redis.call('SET', KEYS[3], cjson.encode({st = 'held', id = ARGV[2], sh = tonumber(ARGV[4]),
  e = tonumber(ARGV[5]), q = granted, rq = tonumber(ARGV[7])}), 'EX', ARGV[6])
return 1
