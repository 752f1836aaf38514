-- restore_quota.lua — on the account's HOME shard, count a paid hold that
-- the reconciler is about to restore on another shard (restore.lua): the
-- quota record saying where it is (so the hold can be found from its id)
-- and the account's count; and its Idempotency-Key record.
--
-- KEYS: 1 stock  2 users  3 quota  4 the hold's Idempotency-Key record
--       (all on the account's home shard)
-- ARGV: 1 hold id  2 account  3 qty  4 the shard the hold is on
--       5 the key record JSON ('' : none)  6 its TTL in seconds
--       7 the SKU's position ('' in a one-SKU sale): its count is raised
--       with the sale-wide one (the field _lib.lua's sku_field names)
-- Returns:
--   1   counted now (give it back with quota_return.lua if the restore on
--       the hold's shard is refused)
--   0   already counted (the quota record was there: the spill's own
--       reserve.lua reached this primary); it now names the hold's shard
--   -1  refused: the home shard's keys are gone (the cold rebuild counts it)
--
-- Invariant: the count is raised before the hold is restored and at most
-- once per hold id (the quota record decides), so it never falls below
-- what the account holds; a key record left by an unfinished spill of this
-- same hold becomes its answer, so a replay never starts the spill again.

if redis.call('EXISTS', KEYS[1]) == 0 then
  return -1
end
local id, acct, q, shard = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local pos = nil
if ARGV[7] ~= nil and ARGV[7] ~= '' then
  pos = tonumber(ARGV[7])
end
local function raise(by)
  redis.call('HINCRBY', KEYS[2], acct, by)
  if pos ~= nil then
    redis.call('HINCRBY', KEYS[2], acct .. '\n' .. string.format('%d', pos), by)
  end
end
local counted = 0
local raw = redis.call('HGET', KEYS[3], id)
if raw then
  local qr = cjson.decode(raw)
  if tonumber(qr.q) ~= q then
    raise(q - tonumber(qr.q))
  end
else
  raise(q)
  counted = 1
end
redis.call('HSET', KEYS[3], id, cjson.encode({a = acct, q = q, s = shard, p = pos}))
if ARGV[5] ~= '' then
  local prior = redis.call('GET', KEYS[4])
  local mine = false
  if prior then
    local p = cjson.decode(prior)
    mine = p.st == 'spill' and p.id == id
  end
  if not prior or mine then
    redis.call('SET', KEYS[4], ARGV[5], 'EX', ARGV[6])
  end
end
return counted
