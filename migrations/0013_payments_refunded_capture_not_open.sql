-- A capture that arrives after its payment was reported failed is recorded
-- `succeeded` with `refund_required` (issue 43 #5): it sells nothing, so it
-- is not an open payment of its reservation, and the buyer's other payment
-- (which may have sold the unit) stays the one open payment.
-- Invariant 4 unchanged: at most one payment per reservation that is
-- pending or that sold it.
DROP INDEX payments_one_open_per_reservation;
CREATE UNIQUE INDEX payments_one_open_per_reservation
    ON payments (reservation_id)
    WHERE status = 'pending' OR (status = 'succeeded' AND NOT refund_required);
