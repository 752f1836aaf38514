-- Every change a shop acts on leaves as an event (issue 46, DESIGN.md
-- "Events out"): a hold written to Postgres, its expiry, cancellation or
-- rejection, a purchase started, a payment failed. Until now only
-- `order.paid` and `payment.refund_required` were written (by the payment
-- saga, which keeps writing them).
--
-- One named place: these triggers. Whatever path changes a reservation or
-- a payment (settlement, reconcile, the purchase route, the saga) writes
-- its events in the same transaction, so an event exists if and only if
-- its change committed.
--
-- Cost: a settlement batch inserts hundreds of holds at 20,000+ per second.
-- One outbox row per hold would cost a heap row and three index entries
-- to write, and another row version when the relay marks it. So a
-- statement writes ONE outbox row of type 'batch' that carries its events
-- in order: by reference for reservations (below), whole for payments
-- ({"events": [{"id", "type", "data"}, ...]}). The relay expands it
-- (origin/src/events/batch.rs); consumers never see 'batch'.
--
-- Event ids are derived from what changed: 'evt_<reservation id>.held',
-- 'evt_<reservation id>.expired', 'evt_<payment id>.started', ... Each change
-- happens at most once (a row is inserted once, ON CONFLICT DO NOTHING
-- leaves it out of the transition table; a status leaves a live state once),
-- so the id is stable and unique, and two copies of it are one event.

CREATE FUNCTION reservation_event_type(status text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE status
        WHEN 'settled' THEN 'reservation.held'
        WHEN 'expired' THEN 'reservation.expired'
        WHEN 'cancelled' THEN 'reservation.cancelled'
        WHEN 'rejected' THEN 'reservation.rejected'
        -- 'pending_payment' and 'paid' are announced by the payment events.
    END
$$;

-- The events of the reservation rows in `changed` (a transition table),
-- as one 'batch' outbox row; nothing when none has an event.
-- The events of the reservation rows in `changed_new` (a transition table)
-- as one 'batch' row: {"reservations": [id, ...], "types": [type, ...]},
-- in statement order. Only references: building a JSON object per hold here
-- cost ~11 µs per settled hold (settlement 39,600 -> 27,300 holds/s,
-- `loadgen bench-settle`); two arrays of scalars cost ~1 µs. The relay
-- reads what each event says from the reservation row (its sale, SKU,
-- account, qty, times and release reason never change once written).
CREATE FUNCTION outbox_reservations_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        -- A row inserted already released (its release reached settlement
        -- before or with its hold) was a hold all the same: the customer
        -- was told 202. It announces both, the hold first.
        INSERT INTO outbox (event_id, type, payload)
        SELECT 'batch_' || gen_random_uuid(), 'batch',
               jsonb_build_object('reservations', jsonb_agg(c.id ORDER BY c.n, c.step),
                                  'types', jsonb_agg(c.kind ORDER BY c.n, c.step))
          FROM (SELECT i.n, s.step, i.id,
                       CASE s.step WHEN 0 THEN 'reservation.held' ELSE reservation_event_type(i.status) END AS kind
                  FROM (SELECT row_number() OVER () AS n, id, status FROM changed_new) i
                 CROSS JOIN (VALUES (0), (1)) AS s(step)
                 WHERE reservation_event_type(i.status) IS NOT NULL
                   AND (s.step = 0 OR i.status <> 'settled')) c
        HAVING count(*) > 0;
    ELSE
        INSERT INTO outbox (event_id, type, payload)
        SELECT 'batch_' || gen_random_uuid(), 'batch',
               jsonb_build_object('reservations', jsonb_agg(c.id ORDER BY c.n),
                                  'types', jsonb_agg(c.kind ORDER BY c.n))
          FROM (SELECT row_number() OVER () AS n, i.id, reservation_event_type(i.status) AS kind
                  FROM changed_new i
                  JOIN changed_old o ON o.id = i.id
                 WHERE o.status IS DISTINCT FROM i.status) c
         WHERE c.kind IS NOT NULL
        HAVING count(*) > 0;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER outbox_reservations_inserted
    AFTER INSERT ON reservations
    REFERENCING NEW TABLE AS changed_new
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_reservations_changed();

CREATE TRIGGER outbox_reservations_updated
    AFTER UPDATE ON reservations
    REFERENCING OLD TABLE AS changed_old NEW TABLE AS changed_new
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_reservations_changed();

-- A purchase started (a payment row inserted, 'pending') and a payment
-- failed. A payment that succeeds is announced by the saga itself
-- (`order.paid`, or `payment.refund_required` when the hold was gone).
-- Payments are few (one per purchase), so their events are written whole.

-- The events of `kind` for the payments `ids` (in that order), as one
-- 'batch' row; nothing when `ids` is empty.
CREATE FUNCTION outbox_payment_events(ids text[], kind text) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO outbox (event_id, type, payload)
    SELECT 'batch_' || gen_random_uuid(), 'batch',
           jsonb_build_object('events', jsonb_agg(jsonb_build_object(
               'id', 'evt_' || p.id || '.' || split_part(kind, '.', 2),
               'type', kind,
               'data', jsonb_build_object(
                   'payment_id', p.id, 'reservation_id', p.reservation_id,
                   'sale', p.sale_id, 'sku', k.id, 'account', p.account,
                   'amount_cents', p.amount_cents, 'qty', r.qty))
               ORDER BY u.n))
      FROM unnest(ids) WITH ORDINALITY AS u(id, n)
      JOIN payments p ON p.id = u.id
      LEFT JOIN reservations r ON r.id = p.reservation_id
      LEFT JOIN skus k ON k.sale_id = r.sale_id AND k.position = r.sku
    HAVING count(*) > 0;
$$;

-- A statement that names a transition table runs only in a trigger that
-- has it (an INSERT has no old table): plpgsql plans each branch only when
-- it runs.
CREATE FUNCTION outbox_payments_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM outbox_payment_events(
            ARRAY(SELECT i.id FROM changed_new i WHERE i.status = 'pending'), 'payment.started');
    ELSE
        PERFORM outbox_payment_events(
            ARRAY(SELECT i.id FROM changed_new i JOIN changed_old o ON o.id = i.id
                   WHERE i.status = 'failed' AND o.status IS DISTINCT FROM 'failed'),
            'payment.failed');
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER outbox_payments_inserted
    AFTER INSERT ON payments
    REFERENCING NEW TABLE AS changed_new
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_payments_changed();

CREATE TRIGGER outbox_payments_updated
    AFTER UPDATE ON payments
    REFERENCING OLD TABLE AS changed_old NEW TABLE AS changed_new
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_payments_changed();
