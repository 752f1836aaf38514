-- A shadow queue for failed bot checks (issue 47, docs/operations.md): a
-- sale may answer a join whose bot check failed with a place in line that
-- never moves up, instead of an error a bot would retry on. Off by default.
ALTER TABLE sales ADD COLUMN bot_shadow boolean NOT NULL DEFAULT false;
