-- quota_return.lua — give back the quota a home shard reserved for a spill.
--
-- KEYS: 1 users  2 quota  [3 idempotency key] (all on the account's home shard)
-- ARGV: 1 hold id
-- Returns 1 when quota was returned, 0 when there was none (already returned).
--
-- Called when a spill found every shard empty (with KEYS[3]: the pending
-- idempotency record is dropped so a later retry starts afresh), and when a
-- spilled hold was released on its shard (the `unquota` note, carried over
-- by the origin's sweep). Invariant: quota comes back at most once per hold
-- id (HDEL decides), so a replayed note cannot lower the count twice; the
-- quota record names the SKU, so the SKU's count comes back with it.

local raw = redis.call('HGET', KEYS[2], ARGV[1])
if raw then
  local qr = cjson.decode(raw)
  redis.call('HDEL', KEYS[2], ARGV[1])
  -- The sale-wide count, and in a sale of several SKUs the SKU's (the
  -- field _lib.lua's sku_field names; this script runs without _lib.lua).
  local fields = {qr.a}
  if qr.p ~= nil then
    fields[2] = qr.a .. '\n' .. string.format('%d', qr.p)
  end
  for _, f in ipairs(fields) do
    if redis.call('HINCRBY', KEYS[1], f, -qr.q) <= 0 then
      redis.call('HDEL', KEYS[1], f)
    end
  end
end
if KEYS[3] then
  local prior = redis.call('GET', KEYS[3])
  if prior then
    local p = cjson.decode(prior)
    if p.st == 'spill' and p.id == ARGV[1] then
      redis.call('DEL', KEYS[3])
    end
  end
end
if raw then
  return 1
end
return 0
