-- An input file of a tenant: its endpoint, line count, whole reservation,
-- whole money (of its priced lines) and a model of it without a price
-- ('' for none). FOR SHARE: a purge waits for a reserve reading it.
SELECT f.endpoint, f.lines,
       (SELECT coalesce(sum(l.reserved_micro), 0)::bigint FROM batch_file_lines l
        WHERE l.provider = f.provider AND l.file_id = f.id),
       (SELECT coalesce(sum(l.money_micro), 0)::bigint FROM batch_file_lines l
        WHERE l.provider = f.provider AND l.file_id = f.id),
       coalesce((SELECT min(l.model) FROM batch_file_lines l
                 WHERE l.provider = f.provider AND l.file_id = f.id AND l.money_micro IS NULL), '')
FROM batch_files f WHERE f.provider = $1 AND f.id = $2 AND f.tenant_id = $3
FOR SHARE OF f
