-- Whether a lease has admissions whose ledger entries are still to write
-- (admission_lease_book.sql), read without a lock: a renew with none skips
-- its booking transaction.
SELECT EXISTS (
    SELECT 1 FROM admissions a
    WHERE a.lease_id = $1
      AND a.lease_seq > coalesce((SELECT booked_seq FROM admission_lease_books WHERE lease_id = $1), 0)
)
