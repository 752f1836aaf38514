-- Issue 13: admission control. An operator may pause a sale (`origin sale
-- update --paused true|false`): the edge's frontier holds while it is
-- paused, and admitted people's windows are extended by the pause. The
-- edge's admission controller backs off when the reservation path's p99 goes
-- over `admission_p99_ms`. Both are published in the sale summary.
ALTER TABLE sales
    ADD COLUMN paused boolean NOT NULL DEFAULT false,
    ADD COLUMN admission_p99_ms double precision NOT NULL DEFAULT 50
        CHECK (admission_p99_ms > 0);
