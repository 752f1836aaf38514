-- Issue 19: bots get no better odds than people. A sale says what a join
-- must bring at the edge (`bot_check`: `none`, `pow:<bits>` or
-- `turnstile`) and how many joins per address per minute the edge accepts
-- (`join_limit`, one of the edge's rate-limiting bindings; 0 = none). Both are
-- published in the sale summary; existing sales keep joining as before
-- (`none`) with the default limit.
ALTER TABLE sales
    ADD COLUMN bot_check text NOT NULL DEFAULT 'none'
        CHECK (bot_check ~ '^(none|turnstile|pow:([1-9]|[12][0-9]|3[0-2]))$'),
    ADD COLUMN join_limit integer NOT NULL DEFAULT 1000
        CHECK (join_limit IN (0, 10, 30, 100, 300, 1000));
