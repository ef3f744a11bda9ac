-- Whether a lease has events whose ledger entries are still to write
-- (admission_lease_book.sql: its admissions and the ends its journal
-- made), read without a lock: a renew with none skips its booking
-- transaction. Each last seq is read down its index (max over an equality
-- prefix: one index entry): an EXISTS of the rows above the cursor was
-- planned, generically, as a scan of admissions that met the unbooked rows
-- last, since a renewed lease names most of a hot tenant's rows (14 ms a
-- call at 49,000 rows; BENCHMARKS.md, "Quota leasing, third step").
SELECT greatest(coalesce((SELECT max(a.lease_seq) FROM admissions a WHERE a.lease_id = $1), 0),
                coalesce((SELECT max(a.lease_end_seq) FROM admissions a WHERE a.lease_id = $1 AND a.lease_end_seq IS NOT NULL), 0))
     > coalesce((SELECT booked_seq FROM admission_lease_books WHERE lease_id = $1), 0)
