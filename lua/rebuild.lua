-- rebuild.lua — restore one shard that Redis lost, from Postgres: swap in what
-- rebuild_stage.lua staged (holds, exp, users, quota), then give the shard
-- its stock.
--
-- KEYS: 1..7 the shard's keys (see _lib.lua)  8..11 this rebuild's staging
--       keys for holds, exp, users and quota (rebuild_stage.lua's KEYS 2..5)
-- ARGV: 1 stock (position 0's)  2..5 how many holds, expiries, account
--       counts and quota entries the rebuild staged  6 in a sale of several
--       SKUs, the other SKUs' stock on this shard: JSON [[position, stock], …]
--       ('' or absent: none); set before KEYS[1], which makes the shard live
-- Returns 1 when rebuilt; 0 when refused because the shard has stock (it is
-- live: reconcile it instead of overwriting it); -1 when refused because the
-- staged copy is not all there (Redis lost data again while it was staged,
-- or the staging keys expired): the shard stays lost for the next rebuild.
-- Whatever it returns, the staging keys are gone afterwards.
--
-- Invariant: a rebuild never overwrites a live shard; afterwards stock +
-- held units on the shard equal its share of the sale, as Postgres records
-- it. Nothing ever sees the shard half rebuilt: the holds, their expiries,
-- the counts and the stock appear in this one script. A staged key moves by
-- RENAME (O(1)) and loses the staging expiry (PERSIST), so the script is
-- short however many holds the shard has. Where a live key exists already
-- (written while the shard had no stock), the staged entries are written
-- over it one by one, as the whole-shard script did before staging.

local function drop_staging()
  for i = 8, 11 do
    redis.call('UNLINK', KEYS[i])
  end
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  drop_staging()
  return 0
end
-- A partial copy made live would hold fewer holds and counts than its stock
-- assumes: units no one holds, and accounts whose count is gone could buy
-- past the per-user limit.
for i = 8, 11 do
  local n = i == 9 and redis.call('ZCARD', KEYS[i]) or redis.call('HLEN', KEYS[i])
  if n ~= tonumber(ARGV[i - 6]) then
    drop_staging()
    return -1
  end
end
for i = 2, 5 do
  local live, staged = KEYS[i], KEYS[i + 6]
  if redis.call('EXISTS', staged) == 1 then
    if redis.call('EXISTS', live) == 0 then
      redis.call('RENAME', staged, live)
      redis.call('PERSIST', live)
    else
      if i == 3 then
        local e = redis.call('ZRANGE', staged, 0, -1, 'WITHSCORES')
        for j = 1, #e, 2 do
          redis.call('ZADD', live, e[j + 1], e[j])
        end
      else
        local e = redis.call('HGETALL', staged)
        for j = 1, #e, 2 do
          redis.call('HSET', live, e[j], e[j + 1])
        end
      end
      redis.call('UNLINK', staged)
    end
  end
end
if ARGV[6] ~= nil and ARGV[6] ~= '' then
  for _, ps in ipairs(cjson.decode(ARGV[6])) do
    redis.call('SET', KEYS[1] .. ':' .. string.format('%d', ps[1]), ps[2])
  end
end
redis.call('SET', KEYS[1], ARGV[1])
return 1
