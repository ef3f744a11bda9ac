-- The balances and chain heads of a batch's tenants, one array element per
-- tenant. window_usage is each tenant's windows' usage as JSON text (NULL
-- for a tenant without windows).
UPDATE tenants t
SET tokens_micro = u.tokens_micro, tokens_at = u.tokens_at, requests_micro = u.requests_micro,
    requests_at = u.requests_at, open_reservations = u.open_reservations, window_usage = u.window_usage::jsonb,
    ledger_seq = u.ledger_seq, ledger_hash = u.ledger_hash
FROM unnest($1::text[], $2::bigint[], $3::timestamptz[], $4::bigint[], $5::timestamptz[], $6::integer[],
            $7::text[], $8::bigint[], $9::bytea[])
     AS u (id, tokens_micro, tokens_at, requests_micro, requests_at, open_reservations, window_usage,
           ledger_seq, ledger_hash)
WHERE t.id = u.id
