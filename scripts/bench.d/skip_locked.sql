-- The best Postgres-only design: a pool of unit rows, each request takes a
-- free one starting at a random place, skipping rows others have locked.
\set r random(1, 1000000)
UPDATE pool SET taken = true
WHERE id = (SELECT id FROM pool WHERE id >= :r AND NOT taken ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED);
