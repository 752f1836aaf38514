-- rebuild_stage.lua — stage one chunk of a lost shard's rebuild; rebuild.lua
-- swaps the staged keys in once every chunk is there.
--
-- KEYS: 1 the shard's stock  2..5 this rebuild's staging keys for holds, exp,
--       users and quota (`ShardKeys::rebuild_staging`: under the shard's hash
--       tag, named by this rebuild's own token)
-- ARGV: 1 JSON of one chunk of what Postgres knows for this shard:
--         {"holds": [[id, {a,q,e,h,c,s,…}], …],  live holds ON this shard
--          "users": [[account, units], …],     counts of accounts whose HOME is this shard
--          "quota": [[id, {a,q,s}], …]}        spilled holds whose home is this shard
--       2 how long (ms) the staging keys live if the rebuild never commits
--         (its process died): each chunk renews it
-- Returns 1 when staged, 0 when refused because the shard has stock (another
-- rebuild committed first; rebuild.lua then drops this one's staging keys).
--
-- Invariant: only this rebuild's staging keys are written, none that a
-- reservation, release, sweep or payment reads, so the shard stays lost
-- (`503 sale_unavailable`) until rebuild.lua makes it whole in one step. One
-- call is one chunk (~10 µs of Redis per entry), so no call blocks Redis for
-- long however big the sale: the whole shard in one script took 1.1 s for
-- 100,000 holds (SLOWLOG, 2026-12-04).

if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
local data = cjson.decode(ARGV[1])
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
for i = 2, 5 do
  redis.call('PEXPIRE', KEYS[i], ARGV[2])
end
return 1
