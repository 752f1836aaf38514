-- The operator's admin API (issue 47, docs/operations.md "The console"):
-- the message every waiting page shows, and the audit log of every write.
--
-- Invariants: `audit_log` is append-only: the triggers below refuse every
-- UPDATE, DELETE and TRUNCATE, whoever sends it, so an entry once written
-- says forever who did what and when (a refused write included). An entry
-- names its sale by text, not by a foreign key: a refused write may name a
-- sale that does not exist, and the log outlives any sale.
ALTER TABLE sales
    ADD COLUMN message    text CHECK (char_length(message) BETWEEN 1 AND 280),
    ADD COLUMN message_at timestamptz;

CREATE TABLE audit_log (
    id      bigserial PRIMARY KEY,
    at      timestamptz NOT NULL DEFAULT now(),
    -- The admin key's id (never its secret); NULL when no known key was sent.
    key_id  text,
    action  text NOT NULL,
    sale    text,
    -- NULL when the write was applied; else the error code it was refused with.
    refused text,
    -- The request as sent, and the sale (or what the action touched)
    -- before and after; NULL where there is none.
    request jsonb,
    before  jsonb,
    after   jsonb
);
CREATE INDEX audit_log_sale ON audit_log (sale, id DESC);

CREATE FUNCTION audit_log_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_log is append-only: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END
$$;
CREATE TRIGGER audit_log_no_update_or_delete BEFORE UPDATE OR DELETE ON audit_log
    FOR EACH ROW EXECUTE FUNCTION audit_log_append_only();
CREATE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON audit_log
    FOR EACH STATEMENT EXECUTE FUNCTION audit_log_append_only();
