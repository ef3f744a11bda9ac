-- +goose Up
-- From this release a replica settles the admissions it made from a lease
-- in that lease's journal group (docs/leasing.md, "Settles in the
-- journal"): it writes lease_end_seq (00036), and the lease's booking
-- writes the settle entries in the lease's order. A replica of a release
-- before 00036 books a lease without knowing its ends, and would move the
-- lease's cursor past them, their settle entries never written. So leasing
-- is off across this upgrade: the migration refuses to run while a lease
-- is live (set every tenant's lease mode off first, which ends and books
-- its leases at once), and the down migration while an end is not booked.
-- The release of 00036 books ends already; its replicas may run beside
-- this one.
-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM leases WHERE state = 'live') THEN
        RAISE EXCEPTION 'quota leasing must be off across this upgrade: set every tenant''s lease mode off (tokengate tenant update NAME --lease off, which ends and books its leases), then migrate; turn it back on once every replica runs this release';
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM leases WHERE state = 'live') OR EXISTS (SELECT 1 FROM admissions a WHERE a.lease_end_seq IS NOT NULL
               AND a.lease_end_seq > coalesce((SELECT b.booked_seq FROM admission_lease_books b WHERE b.lease_id = a.lease_id), 0)) THEN
        RAISE EXCEPTION 'leased admissions'' ends are not booked yet: set every tenant''s lease mode off first';
    END IF;
END
$$;
-- +goose StatementEnd
