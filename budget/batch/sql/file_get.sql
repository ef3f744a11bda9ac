-- An input file of a tenant: its endpoint, line count and whole reservation.
SELECT f.endpoint, f.lines, (SELECT coalesce(sum(l.reserved_micro), 0)::bigint FROM batch_file_lines l
                             WHERE l.provider = f.provider AND l.file_id = f.id)
FROM batch_files f WHERE f.provider = $1 AND f.id = $2 AND f.tenant_id = $3
