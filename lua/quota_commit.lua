-- quota_commit.lua — a spill found its units: record where, on the home shard.
--
-- KEYS: 1 users  2 quota  3 idempotency key (all on the account's home shard)
-- ARGV: 1 account  2 hold id  3 granted qty  4 shard that holds it
--       5 expires_ms  6 idempotency ttl (s)  7 the qty the request asked for
--       8 the SKU's position ('' in a one-SKU sale)
-- Returns 1 when recorded, 0 when it already was (a concurrent replay).
--
-- Invariant: the account's count equals the units it actually holds — when a
-- shard granted fewer units than the quota reserved (partial fill), the
-- difference is given back here, once (to the SKU's count too, in a sale of
-- several SKUs).
--
-- Not prepended with _lib.lua (it moves no unit), so the SKU count's field
-- name is written out here as _lib.lua's sku_field writes it.

local prior = redis.call('GET', KEYS[3])
if prior then
  local p = cjson.decode(prior)
  if p.st == 'held' or p.id ~= ARGV[2] then
    return 0
  end
end
local granted = tonumber(ARGV[3])
local pos = nil
if ARGV[8] ~= nil and ARGV[8] ~= '' then
  pos = tonumber(ARGV[8])
end
local raw = redis.call('HGET', KEYS[2], ARGV[2])
if raw then
  local qr = cjson.decode(raw)
  if qr.q > granted then
    redis.call('HINCRBY', KEYS[1], ARGV[1], granted - qr.q)
    if qr.p ~= nil then
      redis.call('HINCRBY', KEYS[1], ARGV[1] .. '\n' .. string.format('%d', qr.p), granted - qr.q)
    end
  end
  redis.call('HSET', KEYS[2], ARGV[2], cjson.encode({a = qr.a, q = granted, s = tonumber(ARGV[4]), p = qr.p}))
end
redis.call('SET', KEYS[3], cjson.encode({st = 'held', id = ARGV[2], sh = tonumber(ARGV[4]),
  e = tonumber(ARGV[5]), q = granted, rq = tonumber(ARGV[7]), p = pos}), 'EX', ARGV[6])
return 1
