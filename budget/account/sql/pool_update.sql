UPDATE pools p SET tokens_micro = u.tokens_micro, tokens_at = u.tokens_at
FROM unnest($1::text[], $2::bigint[], $3::timestamptz[]) AS u (id, tokens_micro, tokens_at)
WHERE p.id = u.id
