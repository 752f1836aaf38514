-- Reservations as Postgres knows them (the truth). A row appears when the
-- settlement worker writes a hold from a shard's stream ('settled'), and
-- moves on by conditional updates only (WHERE status = …).
CREATE TABLE reservations (
    id             text PRIMARY KEY,
    sale_id        text NOT NULL REFERENCES sales (id),
    account        text NOT NULL,
    qty            integer NOT NULL CHECK (qty > 0),
    status         text NOT NULL CHECK (status IN
                     ('settled', 'pending_payment', 'paid', 'expired', 'cancelled', 'rejected')),
    shard          integer NOT NULL CHECK (shard >= 0),
    home           integer NOT NULL CHECK (home >= 0),
    created_at     timestamptz NOT NULL,
    expires_at     timestamptz NOT NULL,
    settled_at     timestamptz NOT NULL DEFAULT now(),
    released_at    timestamptz,
    release_reason text
);
CREATE INDEX reservations_sale_status ON reservations (sale_id, status);
CREATE INDEX reservations_sale_account ON reservations (sale_id, account);

-- Consumers record the message ids they have processed, so a redelivered
-- message changes nothing (exactly-once effects on at-least-once delivery).
CREATE TABLE processed_messages (
    consumer     text NOT NULL,
    message_id   text NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
);
