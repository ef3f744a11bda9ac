-- The admissions a batch settles or releases, locked after their tenants
-- (the lock order is always tenant rows, then admission rows), in id order.
SELECT * FROM admissions WHERE id = ANY($1::text[]) ORDER BY id FOR UPDATE
