-- Outgoing webhooks (issue 46, docs/webhooks.md): the endpoints operators
-- register and one delivery row per event and endpoint.
--
-- Invariants: a delivery row exists once per (endpoint, event) (UNIQUE),
-- so a republished event is not delivered twice; it is written in the
-- relay's transaction that marks the event published (no event is
-- published without its deliveries, none is queued twice). Deliveries to
-- one endpoint with the same `order_key` (the reservation) go one at a
-- time, in id order: `deliver` picks a delivery only when no earlier one
-- of its key is still pending.
CREATE TABLE webhook_endpoints (
    id                    text PRIMARY KEY,
    url                   text NOT NULL,
    -- NULL: every event type.
    events                text[],
    secret                text NOT NULL CHECK (secret LIKE 'whsec\_%'),
    -- The secret before the last rotation signs too until then, so a
    -- receiver still holding it keeps verifying.
    previous_secret       text,
    previous_secret_until timestamptz,
    created_at            timestamptz NOT NULL DEFAULT now(),
    removed_at            timestamptz
);

CREATE TABLE webhook_deliveries (
    id              bigserial PRIMARY KEY,
    endpoint_id     text NOT NULL REFERENCES webhook_endpoints (id),
    event_id        text NOT NULL,
    event_type      text NOT NULL,
    order_key       text NOT NULL,
    -- The event's envelope, exactly what is POSTed (serialised).
    body            jsonb NOT NULL,
    status          text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'delivered', 'dead')),
    attempts        integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    last_status     integer,
    last_error      text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    delivered_at    timestamptz,
    UNIQUE (endpoint_id, event_id)
);
CREATE INDEX webhook_deliveries_pending ON webhook_deliveries (endpoint_id, id) WHERE status = 'pending';
CREATE INDEX webhook_deliveries_in_order ON webhook_deliveries (endpoint_id, order_key, id) WHERE status = 'pending';
CREATE INDEX webhook_deliveries_dead ON webhook_deliveries (endpoint_id, id) WHERE status = 'dead';
