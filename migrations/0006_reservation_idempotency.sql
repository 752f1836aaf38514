-- The Idempotency-Key behind each reservation, as the hash that names its
-- Redis record (never the key itself), and the qty the request asked for.
-- A cold rebuild restores the key records from here, so a client retrying
-- a key after Redis lost its data gets its first answer, not a second hold.
-- NULL for reservations settled before this column existed.
ALTER TABLE reservations
    ADD COLUMN idem text,
    ADD COLUMN requested_qty integer CHECK (requested_qty > 0);
