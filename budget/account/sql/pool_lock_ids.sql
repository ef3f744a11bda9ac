SELECT * FROM pools WHERE id = ANY($1::text[]) ORDER BY id FOR UPDATE
