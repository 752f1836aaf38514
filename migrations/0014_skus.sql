-- A sale sells SKUs (issue 45, docs/skus.md): sizes, seat tiers, products,
-- each with its own units, price and, optionally, its own per-account limit
-- (the sale's `per_user_limit` stays the limit across all its SKUs).
--
-- Every sale that exists becomes a sale of one SKU at position 0, whose id
-- is the sale's id, whose name, price and units are the sale's: exactly
-- what `origin sale create --units --price-cents` makes from now on. No row
-- of any other table changes.
--
-- `position` is the SKU's number in its sale (the order the operator gave):
-- reservations and Redis keys name a SKU by it.
CREATE TABLE skus (
    sale_id        text NOT NULL REFERENCES sales (id),
    id             text NOT NULL CHECK (id ~ '^[a-z0-9][a-z0-9_-]{0,63}$'),
    position       integer NOT NULL CHECK (position BETWEEN 0 AND 999),
    name           text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    price_cents    bigint NOT NULL CHECK (price_cents >= 0),
    units_total    integer NOT NULL CHECK (units_total > 0),
    per_user_limit integer CHECK (per_user_limit > 0),
    PRIMARY KEY (sale_id, id),
    UNIQUE (sale_id, position)
);

INSERT INTO skus (sale_id, id, position, name, price_cents, units_total)
SELECT id, id, 0, name, price_cents, units_total FROM sales;

-- The SKU a reservation holds, by position. A constant default adds the
-- column without rewriting the table (PostgreSQL 11+), and is the one SKU
-- of every reservation written before SKUs existed. No foreign key: the
-- settlement worker inserts these rows in batches on the hot path, and the
-- SKU was checked against the sale when the hold was granted.
ALTER TABLE reservations ADD COLUMN sku integer NOT NULL DEFAULT 0 CHECK (sku BETWEEN 0 AND 999);
