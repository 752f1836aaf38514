-- reserve.lua — one reservation attempt on the account's HOME shard.
--
-- KEYS: 1..7 the home shard's keys (see _lib.lua), 8 idempotency key
--       (`<shard>:idem:<hash(account, Idempotency-Key)>`, same slot).
-- ARGV: 1 account  2 qty  3 per-user limit  4 hold_ms  5 hold id
--       6 this shard's index  7 sale id  8 idempotency ttl (s)
--       9 reclaim batch  10 the shards a spill could find this SKU on,
--       counting this one (Placement::reachable_from; 1: none but this one)
--       11 idempotency hash (KEYS[8]'s last part, kept with the hold so a
--       cold rebuild can restore KEYS[8])  12 the SKU's position ('' in a
--       one-SKU sale)  13 the SKU's own per-account limit ('' : none)
-- Returns {code, ...}:
--   {1, id, shard, expires_ms, qty}  HELD: a new hold on this shard
--   {2, id, shard, expires_ms, qty}  REPLAY: the key was used; the first answer
--   {3, id, qty}                     SPILL: this shard is empty; the account's
--                                    quota is reserved here under `id`; the
--                                    origin now tries the other shards (take.lua)
--   {4, id, qty}                     PENDING: replay of an unfinished spill: continue it
--                                    with THIS qty (the first request's), never the replay's
--   {5, used}                        LIMIT: qty would take the account over its limit
--   {6}                              EMPTY: nothing here and no other shard (sold out)
--   {7}                              UNINITIALIZED: the shard's keys are gone (Redis lost
--                                    data): refuse to sell blind
--   {9, first qty}                   REUSED: the key was used for a request with another
--                                    qty or another SKU; nothing changes (answered 422)
--   {10, used}                       SKU LIMIT: qty would take the account over the SKU's
--                                    own limit (`used`: its units of this SKU)
--   {11}                             REVOKED: an operator (or the origin) ended this
--                                    account's admission to the sale (the users hash's
--                                    `<account>\nr` field, `sales::revoke`): no new hold
--
-- Invariants: (1) stock never goes below zero — units are granted only from
-- what `stock` holds; (2) the account's count on its home shard is raised by
-- every unit it holds or may hold (spill quota) BEFORE the unit is granted,
-- and the limit is checked against it, so the per-user limit holds across
-- shards; in a sale of several SKUs the account's count of the SKU is
-- raised and checked against the SKU's limit in the same step, so both
-- limits hold together; (3) a hold and its settlement record are written together;
-- (4) one Idempotency-Key is one request: it gives one hold at most, and a
-- replay never asks for more than the first request counted (its qty is
-- stored with the key and compared).
-- Partial fill: when fewer than qty units remain here, the rest are granted
-- (sell every unit); the answer carries the granted qty.

local qty, pos = tonumber(ARGV[2]), position_arg(ARGV[12])
local prior = redis.call('GET', KEYS[8])
if prior then
  local p = cjson.decode(prior)
  if (p.rq and tonumber(p.rq) ~= qty) or p.p ~= pos then
    return {9, p.rq or qty}
  end
  if p.st == 'held' then
    return {2, p.id, p.sh, p.e, p.q}
  end
  return {4, p.id, p.q}
end

local acct, limit = ARGV[1], tonumber(ARGV[3])
local now, hold_ms, id, shard = now_ms(), tonumber(ARGV[4]), ARGV[5], tonumber(ARGV[6])
local used = tonumber(redis.call('HGET', KEYS[4], acct) or '0')
if used + qty > limit then
  return {5, used}
end
-- A replay above still answers the hold the account made before its
-- admission was revoked; a new hold is refused (after the limit: a buyer
-- whose admission ended for having bought all it may is told that).
if redis.call('HEXISTS', KEYS[4], revoked_field(acct)) == 1 then
  return {11}
end
if pos ~= nil and ARGV[13] ~= '' then
  local sku_used = tonumber(redis.call('HGET', KEYS[4], sku_field(acct, pos)) or '0')
  if sku_used + qty > tonumber(ARGV[13]) then
    return {10, sku_used}
  end
end

-- A shard the SKU is not placed on has no key for it: empty here, unless
-- the shard itself is gone (KEYS[1] exists on every live shard). Asked
-- only when the SKU's key is missing, so a placed SKU pays nothing for it.
local stock = stock_for(qty, now, shard, tonumber(ARGV[9]), pos)
if not stock then
  if pos == nil or pos == 0 or redis.call('EXISTS', KEYS[1]) == 0 then
    return {7}
  end
  stock = 0
end

local sku = pos and (',"p":' .. int(pos)) or ''
if stock >= 1 then
  local q = math.min(stock, qty)
  count(KEYS[4], acct, pos, q)
  local exp = grant_hold(id, acct, q, now, hold_ms, shard, ARGV[7], ARGV[11], qty, pos)
  -- Written out like the hold record (grant_hold in _lib.lua).
  redis.call('SET', KEYS[8], '{"st":"held","id":' .. cjson.encode(id) .. ',"sh":' .. int(shard) .. ',"e":'
    .. int(exp) .. ',"q":' .. int(q) .. ',"rq":' .. int(qty) .. sku .. '}', 'EX', ARGV[8])
  return {1, id, shard, exp, q}
end

if tonumber(ARGV[10]) <= 1 then
  return {6}
end

count(KEYS[4], acct, pos, qty)
redis.call('HSET', KEYS[5], id, cjson.encode({a = acct, q = qty, p = pos}))
redis.call('SET', KEYS[8], cjson.encode({st = 'spill', id = id, q = qty, rq = qty, p = pos}), 'EX', ARGV[8])
return {3, id, qty}
