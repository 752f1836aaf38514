-- _lib.lua — helpers shared by the shard scripts. The origin prepends this
-- file to reserve.lua, take.lua, release.lua, sweep.lua, confirm.lua, observe.lua,
-- reconcile.lua and restore.lua when it loads them, so every script stays one EVALSHA on
-- one hash slot.
--
-- Shard KEYS layout (all under one hash tag, so one cluster slot):
--   1 stock    string  units still for sale on this shard (of the SKU at
--                      position 0; see "SKUs" below)
--   2 holds    hash    hold id -> {a=account,q=qty,e=expires_ms,h=home,c=created_ms,s=status,
--                      k=idempotency hash,r=requested qty,p=SKU position}
--   3 exp      zset    hold id scored by expires_ms (live, unpaid holds only)
--   4 users    hash    account -> units held+bought, for accounts whose HOME is this shard;
--                      account.."\n"..p -> that account's units of the SKU at position p
--   5 quota    hash    hold id -> {a,q,s,p} quota this home shard reserved for a hold
--                      that spilled to shard s
--   6 stream   stream  settlement records (hold / release / confirm), read by the
--                      settlement worker into Postgres
--   7 unquota  list    quota to give back on another (home) shard after a
--                      spilled hold was released here
--
-- Invariant kept by release_hold: a unit leaves a hold exactly once, and the
-- same script that returns it to `stock` writes the release record, so Redis
-- and the settlement stream cannot disagree. The release record carries
-- everything Postgres needs to write the reservation row itself (home,
-- created, expires), so a release settled before its hold cannot leave a
-- phantom live row (origin/src/settlement.rs).
--
-- SKUs (issue 45, docs/skus.md): in a sale of several SKUs each hold,
-- quota record, key record and release carries its SKU's position `p`; the
-- SKU's stock on this shard is KEYS[1] for position 0 and KEYS[1]..':'..p
-- otherwise (`stock_key`; ShardKeys::stock_of names the same key), under
-- the same hash tag, so still one slot; KEYS[1] exists on every live shard
-- (0 where position 0 is not placed), which is how a script tells a lost
-- shard from one without the SKU. The home shard counts the account's units
-- of each SKU beside its sale-wide count (`sku_field`: the account and the
-- position joined by a newline, which no account id contains: token
-- `valid_subject` refuses control characters). In a one-SKU sale `p` is
-- absent everywhere and the layout is the one from before SKUs.
--
-- Time: every script reads the clock of the Redis it runs on (`TIME`), never
-- the caller's, so several origins with skewed clocks agree on when a hold
-- expires (Redis 5+ replicates scripts by effects, so TIME is allowed).

-- The id of the last entry ever appended to a stream ("0-0" if none): a
-- shard's version. Every unit that moves writes a record in the same
-- script, so an unchanged version means nothing moved (observe.lua).
local function stream_version(key)
  local info = redis.pcall('XINFO', 'STREAM', key)
  if type(info) == 'table' and not info.err then
    for i = 1, #info, 2 do
      if info[i] == 'last-generated-id' then
        return info[i + 1]
      end
    end
  end
  return '0-0'
end

-- An integer as text, for a command's argument. Lua's numbers are doubles,
-- and Redis 7.0 turns a number argument into text with printf's "%.17g",
-- whose multi-precision path for 13-digit times made number formatting
-- about a tenth of Redis's CPU in perf of redis-benchmark on reserve.lua;
-- "%d" writes the same digits for these integers, for much less.
local function int(n)
  return string.format('%d', n)
end

-- The stock key of the SKU at position `p` (nil: a one-SKU sale).
local function stock_key(p)
  if p == nil or p == 0 then
    return KEYS[1]
  end
  return KEYS[1] .. ':' .. int(p)
end

-- The users-hash field marking an account whose admission was revoked
-- (`sales::revoke`); never a count (a position is a number, `r` is not).
local function revoked_field(acct)
  return acct .. '\nr'
end

-- The users-hash field counting an account's units of the SKU at `p`.
local function sku_field(acct, p)
  return acct .. '\n' .. int(p)
end

-- Lowers an account's count(s) on its home shard (users = KEYS[4] or a
-- staging copy) by q: the sale-wide one and, in a sale of several SKUs,
-- the SKU's; a count that reaches 0 is dropped.
local function uncount(users, acct, p, q)
  if redis.call('HINCRBY', users, acct, int(-q)) <= 0 then
    redis.call('HDEL', users, acct)
  end
  if p ~= nil then
    local f = sku_field(acct, p)
    if redis.call('HINCRBY', users, f, int(-q)) <= 0 then
      redis.call('HDEL', users, f)
    end
  end
end

-- Raises an account's count(s) by q (see uncount).
local function count(users, acct, p, q)
  redis.call('HINCRBY', users, acct, int(q))
  if p ~= nil then
    redis.call('HINCRBY', users, sku_field(acct, p), int(q))
  end
end

-- A SKU position from a script argument ('' : a one-SKU sale).
local function position_arg(v)
  if v == nil or v == '' then
    return nil
  end
  return tonumber(v)
end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function release_hold(id, raw, reason, now, shard)
  local h = cjson.decode(raw)
  redis.call('INCRBY', stock_key(h.p), int(h.q))
  redis.call('HDEL', KEYS[2], id)
  redis.call('ZREM', KEYS[3], id)
  if tonumber(h.h) == shard then
    uncount(KEYS[4], h.a, h.p, h.q)
  else
    -- The account's count lives on its home shard (another slot): leave a
    -- note that the origin carries over with quota_return.lua.
    redis.call('RPUSH', KEYS[7], cjson.encode({id = id, a = h.a, q = h.q, h = h.h}))
  end
  redis.call('XADD', KEYS[6], '*', 't', 'release', 'id', id, 'acct', h.a, 'qty', int(h.q),
    'shard', int(shard), 'home', int(h.h), 'created', int(h.c), 'exp', int(h.e), 'idem', h.k or '',
    'rq', int(h.r or h.q), 'reason', reason, 'at', int(now), unpack(h.p and {'p', int(h.p)} or {}))
  return h.q
end

-- Gives back up to `limit` expired holds of this shard; returns the units.
local function reclaim_expired(now, shard, limit)
  local ids = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, limit)
  local units = 0
  for _, id in ipairs(ids) do
    local raw = redis.call('HGET', KEYS[2], id)
    if raw then
      units = units + release_hold(id, raw, 'expired', now, shard)
    else
      redis.call('ZREM', KEYS[3], id)
    end
  end
  return units
end

-- The stock of the SKU at `p` on this shard, topped up by reclaiming
-- expired holds (of any SKU: they go back to their own) when it holds fewer
-- than `qty`; nil when the key is gone (Redis lost data).
local function stock_for(qty, now, shard, batch, p)
  local key = stock_key(p)
  local stock = redis.call('GET', key)
  if not stock then
    return nil
  end
  stock = tonumber(stock)
  if stock < qty and reclaim_expired(now, shard, batch) > 0 then
    stock = tonumber(redis.call('GET', key))
  end
  return stock
end

-- Creates a hold of `qty` units (caller checked stock) and its settlement
-- record. `idem` (the Idempotency-Key's hash) and `rq` (the qty the request
-- asked for) travel with it so a cold rebuild can restore the key's record.
local function grant_hold(id, acct, qty, now, hold_ms, home, sale, idem, rq, p)
  local exp = now + hold_ms
  local exp_s = int(exp)
  redis.call('DECRBY', stock_key(p), int(qty))
  -- The record's JSON written out, not cjson.encode of a table: the same
  -- fields for less (reserve.lua under redis-benchmark, 3 alternating
  -- rounds with the key record below: 23,850 -> 25,097 EVALSHA/s); strings
  -- still go through cjson.encode for their escaping.
  local k = idem and (',"k":' .. cjson.encode(idem)) or ''
  local sku = p and (',"p":' .. int(p)) or ''
  local rec = '{"a":' .. cjson.encode(acct) .. ',"q":' .. int(qty) .. ',"e":' .. exp_s
    .. ',"h":' .. int(home) .. ',"c":' .. int(now) .. ',"s":"held"' .. k .. ',"r":' .. int(rq) .. sku .. '}'
  redis.call('HSET', KEYS[2], id, rec)
  redis.call('ZADD', KEYS[3], exp_s, id)
  -- The settlement record carries the hold record itself (`rec`), not its
  -- fields one by one: 4 fields instead of 11 made the script ~4 % faster
  -- under redis-benchmark and the settler's read of each entry cheaper
  -- (origin/src/settlement.rs reads both this and the older layout; the
  -- shard is the stream's own).
  redis.call('XADD', KEYS[6], '*', 't', 'hold', 'id', id, 'sale', sale, 'rec', rec)
  return exp
end
