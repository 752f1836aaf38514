-- restore.lua — put back a PAID hold that this shard lost (a failover to a
-- replica that never had it) while Postgres recorded it as sold; only if
-- nothing moved on the shard since the reconciler compared it.
--
-- KEYS: 1..7 the shard's keys (see _lib.lua)
--       8 when the hold's home is this shard: its Idempotency-Key record
--         (`<shard>:idem:<hash>`); else take.lua's decision marker for the
--         hold on this shard (`<shard>:spill:<hold id>`)
-- ARGV: 1 the shard's version the comparison saw (observe.lua)
--       2 hold id  3 the hold record (JSON {a,q,e,h,c,s,k,r,p}, s = 'paid';
--         p: its SKU's position in a sale of several, whose stock it takes)
--       4 this shard's index  5 sale id
--       6 KEYS[8]'s value: the key record JSON (home), 'H' (spill marker),
--         or '' (leave KEYS[8] alone)  7 its TTL in seconds
-- Returns:
--   {1, version}  restored: the hold is back as paid (not in the expiry
--                 index), its units taken from stock, a hold record
--                 appended to the stream (the settler finds the row and
--                 changes nothing); when home: the account's count raised
--                 and the key record back unless one exists. `version` is
--                 the shard's version after it, for the next repair of the
--                 same comparison.
--   {0, why}      refused, nothing changed: 'gone' (the shard's keys are
--                 gone: the cold rebuild restores it), 'moved' (the version
--                 changed), 'exists' (the hold is here), 'stock' (fewer
--                 units left than it holds: Redis sold them since; reported)
--
-- Invariant: stock + held units on the shard stay what they were plus
-- nothing: the units the restored hold takes come out of `stock`, in one
-- script, at the version the comparison saw, so it never repairs from a
-- comparison made at another moment, and a unit is never both sold and on
-- sale. Every unit that moves appends to the stream (observe.lua).

if redis.call('EXISTS', KEYS[1]) == 0 then
  return {0, 'gone'}
end
if stream_version(KEYS[6]) ~= ARGV[1] then
  return {0, 'moved'}
end
if redis.call('HEXISTS', KEYS[2], ARGV[2]) == 1 then
  return {0, 'exists'}
end
local h = cjson.decode(ARGV[3])
local q = tonumber(h.q)
if tonumber(redis.call('GET', stock_key(h.p)) or '0') < q then
  return {0, 'stock'}
end
local shard = tonumber(ARGV[4])
redis.call('DECRBY', stock_key(h.p), q)
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
redis.call('ZREM', KEYS[3], ARGV[2])
if tonumber(h.h) == shard then
  count(KEYS[4], h.a, h.p, q)
end
if ARGV[6] ~= '' then
  redis.call('SET', KEYS[8], ARGV[6], 'NX', 'EX', ARGV[7])
end
redis.call('XADD', KEYS[6], '*', 't', 'hold', 'id', ARGV[2], 'sale', ARGV[5], 'acct', h.a,
  'qty', q, 'shard', shard, 'home', h.h, 'exp', h.e, 'at', h.c, 'idem', h.k or '',
  'rq', h.r or q, 'why', 'restored', unpack(h.p and {'p', int(h.p)} or {}))
return {1, stream_version(KEYS[6])}
