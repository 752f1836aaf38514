-- release.lua — give a hold's units back (cancel, or Postgres refused it).
--
-- KEYS: 1..7 the shard's keys (see _lib.lua)
-- ARGV: 1 hold id  2 reason (cancelled | rejected | expired)
--       3 this shard's index  4 force ("1": release even a paid hold — only for
--       a refund path; "0" otherwise)
-- Returns:
--   {1, qty}  released now: stock back, hold gone, the account's count back
--             (or a note to give it back on its home shard), release record written
--   {0}       nothing to release (unknown, or released before): changes nothing
--   {2}       the hold is paid; not released
--
-- Invariant: releasing twice changes nothing the second time (the hold is
-- gone after the first), so units come back exactly once.

local raw = redis.call('HGET', KEYS[2], ARGV[1])
if not raw then
  return {0}
end
local h = cjson.decode(raw)
if h.s == 'paid' and ARGV[4] ~= '1' then
  return {2}
end
local q = release_hold(ARGV[1], raw, ARGV[2], now_ms(), tonumber(ARGV[3]))
return {1, q}
