-- Sales and their inventory: the truth the speed layer is built from.
CREATE TABLE sales (
    id               text PRIMARY KEY CHECK (id ~ '^[a-z0-9][a-z0-9_-]{0,63}$'),
    name             text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    price_cents      bigint NOT NULL CHECK (price_cents >= 0),
    units_total      integer NOT NULL CHECK (units_total > 0),
    per_user_limit   integer NOT NULL CHECK (per_user_limit > 0),
    shards           integer NOT NULL CHECK (shards BETWEEN 1 AND 256),
    shard_tags       text[] NOT NULL,
    starts_at        timestamptz NOT NULL,
    ends_at          timestamptz,
    hold_seconds     integer NOT NULL CHECK (hold_seconds > 0),
    admission_rate   double precision NOT NULL CHECK (admission_rate > 0),
    admission_factor double precision NOT NULL CHECK (admission_factor > 0),
    created_at       timestamptz NOT NULL DEFAULT now(),
    CHECK (cardinality(shard_tags) = shards),
    CHECK (ends_at IS NULL OR ends_at > starts_at)
);

-- Invariant 1 (no oversell) in Postgres: held + sold never exceed total.
CREATE TABLE inventory (
    sale_id text PRIMARY KEY REFERENCES sales (id),
    total   integer NOT NULL CHECK (total > 0),
    held    integer NOT NULL DEFAULT 0,
    sold    integer NOT NULL DEFAULT 0,
    CHECK (held >= 0 AND sold >= 0 AND held + sold <= total)
);
