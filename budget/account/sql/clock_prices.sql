-- clock.sql, and the price book's version, so that a replica knows in the
-- round trip that locks a decision's tenants whether its book is current.
SELECT coalesce($1::timestamptz, clock_timestamp()), (SELECT v FROM price_book_version)
