SELECT id, tokens_micro, ledger_seq, ledger_hash
FROM tenants
WHERE $1 = '' OR id = $1
ORDER BY id
