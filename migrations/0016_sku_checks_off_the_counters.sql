-- A SKU row's counters (held, sold) change in every settlement batch that
-- holds a unit of it, and Postgres evaluates every CHECK constraint of a
-- row on every UPDATE, whatever columns it sets. The id's regular
-- expression was about a third of a 100-SKU batch's `UPDATE skus` (1.2-1.8
-- ms against 0.9 ms without it; issue 45's 1,000-SKU bench, BENCHMARKS.md).
-- The id and name rules now run only when id or name is written: a trigger
-- on INSERT and on UPDATE OF id, name, raising check_violation under the
-- old constraints' names. The counters' CHECK (skus_units_kept) stays: it
-- is the last guard of "never one too many" per SKU.
ALTER TABLE skus DROP CONSTRAINT skus_id_check, DROP CONSTRAINT skus_name_check;

CREATE FUNCTION skus_id_and_name_valid() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.id IS NULL OR NEW.id !~ '^[a-z0-9][a-z0-9_-]{0,63}$' THEN
        RAISE EXCEPTION 'skus.id % is not a slug', NEW.id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'skus_id_check', TABLE = 'skus';
    END IF;
    IF NEW.name IS NULL OR length(NEW.name) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'skus.name must be 1 to 200 characters'
            USING ERRCODE = 'check_violation', CONSTRAINT = 'skus_name_check', TABLE = 'skus';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER skus_id_and_name_valid
    BEFORE INSERT OR UPDATE OF id, name ON skus
    FOR EACH ROW EXECUTE FUNCTION skus_id_and_name_valid();
