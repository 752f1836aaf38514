-- The (sale_id, account) index served one query: the payment limit guard
-- (origin/src/payments.rs, write_success), which sums an account's *paid*
-- units. Indexed over every row it cost each settled hold an index insert
-- (~6 µs of Postgres's ~30 µs per row in 128-row settlement batches,
-- measured with pgbench); only paid rows need to be in it. A row enters it
-- when a payment moves it to 'paid' — an update that writes new index
-- entries anyway (status is in reservations_sale_status).
--
-- On a big table this scans reservations once under a lock that blocks
-- writes: apply it (`origin migrate`) between sales, not during one.
DROP INDEX reservations_sale_account;
CREATE INDEX reservations_paid_by_account ON reservations (sale_id, account) WHERE status = 'paid';
