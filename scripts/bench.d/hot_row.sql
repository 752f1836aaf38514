-- The naive design: one stock row everybody decrements.
UPDATE hot SET stock = stock - 1 WHERE id = 1 AND stock > 0;
