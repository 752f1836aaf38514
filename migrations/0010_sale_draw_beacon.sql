-- Issue 15: the draw v2 names a public randomness beacon (a drand-style HTTP
-- API: `<url>/info`, `<url>/public/<round>`) whose round at or after the
-- start goes into the draw's key, so nobody — the operator included — knows
-- the key before the entrant set is frozen. NULL: the sale names none (the
-- beacon is empty and the summary says "none"). Fixed at creation.
ALTER TABLE sales
    ADD COLUMN draw_beacon text
        CHECK (draw_beacon IS NULL OR (draw_beacon ~ '^https?://' AND length(draw_beacon) <= 512));
