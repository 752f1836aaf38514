-- A reservation's sale exists: checked once per settlement batch instead of
-- by a foreign key per row.
--
-- The foreign key checked every settled hold on its own (an index probe and
-- a KEY SHARE lock on the sale's row): ~4 µs of Postgres's ~12.5 µs per
-- settled hold (pgbench of 250-row settlement inserts, 2026-12-04: 316-327
-- transactions/s with it, 459-478 without), on the cores the requests share;
-- the reservations' p99 at 13,700/s went from 4.4-5.9 ms to 3.7-4.4 ms
-- without it (issue 16, scripts/bench.d/origin-diagnosis.md). What it kept
-- is kept here:
-- - insert: every reservation row is written by a settlement batch, which
--   takes that same KEY SHARE lock on the sale's row once, in the batch's
--   transaction, and writes nothing if the sale is missing
--   (origin/src/settlement.rs, `lock_sale`);
-- - delete, or a change of the sale's id: refused while reservations name
--   it (the trigger below; `inventory` and `payments` still reference
--   `sales` by foreign key).
ALTER TABLE reservations DROP CONSTRAINT reservations_sale_id_fkey;

CREATE FUNCTION sales_keep_reserved() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'UPDATE' AND NEW.id = OLD.id THEN
    RETURN NEW;
  END IF;
  IF EXISTS (SELECT 1 FROM reservations WHERE sale_id = OLD.id) THEN
    RAISE EXCEPTION 'sale % has reservations', OLD.id
      USING ERRCODE = 'foreign_key_violation';
  END IF;
  IF TG_OP = 'DELETE' THEN
    RETURN OLD;
  END IF;
  RETURN NEW;
END
$$;

CREATE TRIGGER sales_keep_reserved
  BEFORE DELETE OR UPDATE OF id ON sales
  FOR EACH ROW EXECUTE FUNCTION sales_keep_reserved();
