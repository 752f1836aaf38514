-- Inventory per SKU (issue 45, docs/skus.md): each SKU counts the units
-- held (settled, pending_payment) and sold (paid) of it, and the CHECK is
-- the last guard of "never one too many" per SKU, as `inventory` is for the
-- whole sale. The settlement worker, the payment saga and the reconciler
-- change a SKU's figures in the same transaction and the same order as the
-- sale's `inventory` row (that row first: it serialises a sale's writers).
--
-- Existing rows are counted from the reservations they have (every sale
-- before SKUs has one SKU, position 0, and every reservation sku = 0).
ALTER TABLE skus
    ADD COLUMN held integer NOT NULL DEFAULT 0,
    ADD COLUMN sold integer NOT NULL DEFAULT 0;

UPDATE skus k
   SET held = r.held, sold = r.sold
  FROM (SELECT sale_id, sku,
               coalesce(sum(qty) FILTER (WHERE status IN ('settled', 'pending_payment')), 0) AS held,
               coalesce(sum(qty) FILTER (WHERE status = 'paid'), 0) AS sold
          FROM reservations
         GROUP BY sale_id, sku) r
 WHERE k.sale_id = r.sale_id AND k.position = r.sku;

ALTER TABLE skus
    ADD CONSTRAINT skus_units_kept CHECK (held >= 0 AND sold >= 0 AND held + sold <= units_total);
