-- Whether a lease has events whose ledger entries are still to write
-- (admission_lease_book.sql: its admissions and the ends its journal
-- made), read without a lock: a renew with none skips its booking
-- transaction. Each last seq is read down its index (max over an equality
-- prefix: one index entry): an EXISTS of the rows above the cursor was
-- planned, generically, as a scan of admissions that met the unbooked rows
-- last, since a renewed lease names most of a hot tenant's rows (14 ms a
-- call at 49,000 rows; BENCHMARKS.md, "Quota leasing, third step").
-- A lease of a replica whose journal writes groups (00039) reads its
-- holder's groups since the one the cursor is in, and the last of its
-- events there.
WITH cursor AS (
    SELECT coalesce((SELECT booked_seq FROM admission_lease_books WHERE lease_id = $1), 0) AS seq
)
SELECT greatest(coalesce((SELECT max(a.lease_seq) FROM admissions a WHERE a.lease_id = $1), 0),
                coalesce((SELECT max(a.lease_end_seq) FROM admissions a WHERE a.lease_id = $1 AND a.lease_end_seq IS NOT NULL), 0),
                coalesce((SELECT max(x.seq)
                          FROM leases l
                          JOIN lease_groups g ON g.replica = l.holder
                          CROSS JOIN LATERAL (
                              SELECT g.seq * 2048 + i AS seq FROM unnest(array_positions(g.lease_ids, $1)) AS i
                              UNION ALL
                              SELECT g.seq * 2048 + 1024 + j FROM unnest(array_positions(g.end_leases, $1)) AS j
                          ) x
                          WHERE l.id = $1 AND g.seq > l.group_from AND g.seq >= (SELECT seq FROM cursor) / 2048
                            AND ($1 = ANY (g.lease_ids) OR $1 = ANY (g.end_leases))), 0))
     > (SELECT seq FROM cursor)
