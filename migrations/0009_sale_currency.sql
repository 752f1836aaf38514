-- Issue 14: the queue page shows the price in the sale's own currency (ISO
-- 4217 code, upper case), published in the sale summary. Existing sales keep
-- the page's former default.
ALTER TABLE sales
    ADD COLUMN currency text NOT NULL DEFAULT 'EUR'
        CHECK (currency ~ '^[A-Z]{3}$');
