-- reconcile.lua — repair one shard's stock from Postgres, only if nothing
-- moved since it was read.
--
-- KEYS: 1 stock  2 stream (one shard's slot)
-- ARGV: 1 stock value the reconciler observed  2 stock Postgres implies
--       3 the shard's version observed with it (observe.lua)
--       4.. in a sale of several SKUs, triples for the other SKUs placed
--       on the shard: position, stock observed, stock Postgres implies
-- Returns 1 when repaired, 0 when refused: the stock or the version changed
-- since they were read (a hold came or went: the figure from Postgres may
-- be stale even if the stock reads the same again), or the shard's
-- settlement stream is not drained (Postgres is behind, so its figure is
-- not the truth yet).
--
-- Invariant: never "repairs" from a Postgres that is behind, nor from a
-- comparison made at another moment than this one.

if redis.call('XLEN', KEYS[2]) > 0 then
  return 0
end
local now = redis.call('GET', KEYS[1])
if not now or now ~= ARGV[1] then
  return 0
end
if stream_version(KEYS[2]) ~= ARGV[3] then
  return 0
end
for i = 4, #ARGV, 3 do
  local v = redis.call('GET', stock_key(tonumber(ARGV[i])))
  if not v or v ~= ARGV[i + 1] then
    return 0
  end
end
redis.call('SET', KEYS[1], ARGV[2])
for i = 4, #ARGV, 3 do
  redis.call('SET', stock_key(tonumber(ARGV[i])), ARGV[i + 2])
end
return 1
