SELECT id, tokens_capacity, tokens_rate_micro, tokens_micro, tokens_at, created_at
FROM pools WHERE id = ANY($1::text[]) ORDER BY id FOR UPDATE
