-- Ended admissions (issue 47): an operator (or the origin) revoked this
-- account's admission to the sale. The truth behind the Redis mark that
-- refuses the account new holds (lua/reserve.lua's REVOKED) and the edge's
-- turn passed on. Never deleted: a revoke is for good, and its audit entry
-- says who asked.
CREATE TABLE revocations (
    sale_id text NOT NULL REFERENCES sales (id),
    account text NOT NULL,
    at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (sale_id, account)
);
