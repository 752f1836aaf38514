-- rebuild.lua — restore one shard that Redis lost, from Postgres.
--
-- KEYS: 1..7 the shard's keys (see _lib.lua)
-- ARGV: 1 stock  2 JSON of what Postgres knows for this shard:
--         {"holds": [[id, {a,q,e,h,c,s}], …],   live holds ON this shard
--          "users": [[account, units], …],     counts of accounts whose HOME is this shard
--          "quota": [[id, {a,q,s}], …]}        spilled holds whose home is this shard
-- Returns 1 when rebuilt, 0 when refused because the shard has stock (it is
-- live: reconcile it instead of overwriting it).
--
-- Invariant: a rebuild never overwrites a live shard; afterwards stock +
-- held units on the shard equal its share of the sale, as Postgres records it.

if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
local data = cjson.decode(ARGV[2])
for _, h in ipairs(data.holds) do
  redis.call('HSET', KEYS[2], h[1], cjson.encode(h[2]))
  if h[2].s ~= 'paid' then
    redis.call('ZADD', KEYS[3], h[2].e, h[1])
  end
end
for _, u in ipairs(data.users) do
  redis.call('HSET', KEYS[4], u[1], u[2])
end
for _, q in ipairs(data.quota) do
  redis.call('HSET', KEYS[5], q[1], cjson.encode(q[2]))
end
redis.call('SET', KEYS[1], ARGV[1])
return 1
