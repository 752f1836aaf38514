-- ack.lua — the barrier of one `REDIS_ACK=wait` round on one shard
-- (origin/src/ack.rs): checks that this primary shows what the clients are
-- about to be told (or what the settler is about to write to Postgres), and
-- writes the point the round's WAIT then waits for.
--
-- KEYS: 1 the shard's barrier counter (`<shard>:ack`), 2 the shard's holds
--       hash, 3 the shard's settlement stream, 4.. Idempotency-Key records
--       the 'replay' facts name (all under the shard's hash tag: one slot)
-- ARGV: pairs (kind, subject), kind one of
--         'held'  the hold (subject: its id) exists (any status): a 202, fresh or replayed
--         'gone'  no such hold: a cancel
--         'paid'  the hold exists and is paid: a payment's confirm
--         'entry' the stream entry exists and is about that subject (subject:
--                 "<entry id> <hold id>"): the settler is about to commit a
--                 settlement entry (field 'id', the hold); or the outbox
--                 relay is about to mark an event published (KEYS[3] the
--                 events stream, field 'event_id', the event's id)
--         'replay' the Idempotency-Key record KEYS[n] exists and names the hold
--                 (subject: "<n> <hold id>"): a replay's 202, whose answer
--                 comes from that record, whether or not the hold is still
--                 there (released since: cancelled, expired, rejected)
-- Returns: one 1 (shown) or 0 (not shown) per pair, in order.
--
-- Writes INCR (and a day's expiry) on KEYS[1]. Redis replicates a script's
-- effects in order within its one replication stream, so once a replica has
-- this INCR it has every write this primary made before it, from whichever
-- connection. The origin sends `WAIT 1 <timeout>` on the same connection
-- right after: WAIT waits for that connection's last write, this INCR.
-- A fact not shown here (the write went to a primary since replaced, or was
-- undone meanwhile) is never acknowledged, whatever WAIT says. An entry is
-- matched by its hold id too, so an entry id a promoted replica generated
-- anew (another clock) never passes for the lost entry it repeats.

redis.call('INCR', KEYS[1])
redis.call('EXPIRE', KEYS[1], 86400)
local out = {}
for i = 1, #ARGV, 2 do
  local kind, id = ARGV[i], ARGV[i + 1]
  local shown
  if kind == 'entry' then
    local eid, hold = string.match(id, '^(%S+) (%S+)$')
    shown = false
    if eid then
      local found = redis.call('XRANGE', KEYS[3], eid, eid)
      if #found == 1 then
        local fields = found[1][2]
        for j = 1, #fields, 2 do
          if (fields[j] == 'id' or fields[j] == 'event_id') and fields[j + 1] == hold then
            shown = true
          end
        end
      end
    end
  elseif kind == 'replay' then
    local n, hold = string.match(id, '^(%d+) (%S+)$')
    shown = false
    local key = n and KEYS[tonumber(n)]
    if key and tonumber(n) >= 4 then
      local rec = redis.call('GET', key)
      if rec then
        shown = cjson.decode(rec).id == hold
      end
    end
  else
    local raw = redis.call('HGET', KEYS[2], id)
    if kind == 'gone' then
      shown = not raw
    elseif kind == 'paid' then
      shown = raw and cjson.decode(raw).s == 'paid'
    else
      shown = raw and true or false
    end
  end
  out[#out + 1] = shown and 1 or 0
end
return out
