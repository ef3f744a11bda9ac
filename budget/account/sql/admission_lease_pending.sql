-- Whether a lease has admissions whose ledger entries are still to write
-- (admission_lease_book.sql), read without a lock: a renew with none skips
-- its booking transaction. Its last lease_seq is read down the lease's
-- index (max over an equality prefix: one index entry): an EXISTS of the
-- rows above the cursor was planned, generically, as a scan of admissions
-- that met the unbooked rows last, since a renewed lease names most of a
-- hot tenant's rows (14 ms a call at 49,000 rows; BENCHMARKS.md, "Quota
-- leasing, third step").
SELECT coalesce((SELECT max(a.lease_seq) FROM admissions a WHERE a.lease_id = $1), 0)
     > coalesce((SELECT booked_seq FROM admission_lease_books WHERE lease_id = $1), 0)
