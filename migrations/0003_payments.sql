-- Payments, the webhook events seen, and the outbox of events for others.
CREATE TABLE payments (
    id               text PRIMARY KEY,
    reservation_id   text NOT NULL REFERENCES reservations (id),
    sale_id          text NOT NULL REFERENCES sales (id),
    account          text NOT NULL,
    amount_cents     bigint NOT NULL CHECK (amount_cents >= 0),
    status           text NOT NULL CHECK (status IN ('pending', 'succeeded', 'failed')),
    idempotency_key  text,
    refund_required  boolean NOT NULL DEFAULT false,
    provider_event_id text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now()
);
-- Invariant 4: at most one open (pending or succeeded) payment per reservation.
CREATE UNIQUE INDEX payments_one_open_per_reservation
    ON payments (reservation_id) WHERE status IN ('pending', 'succeeded');
CREATE UNIQUE INDEX payments_idempotency
    ON payments (account, idempotency_key) WHERE idempotency_key IS NOT NULL;

-- Events for other services, written in the same transaction as the state
-- change they announce; the relay publishes them at least once.
CREATE TABLE outbox (
    id           bigserial PRIMARY KEY,
    event_id     text NOT NULL UNIQUE,
    type         text NOT NULL,
    payload      jsonb NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    published_at timestamptz
);
CREATE INDEX outbox_unpublished ON outbox (id) WHERE published_at IS NULL;
