-- +goose Up
-- A journal group commits in one round trip when nothing in it needs a
-- decision the group can only make after reading (budget/lease, journal.go,
-- "one round trip"): it sends its statements and COMMIT at once, and each
-- statement that would have been read and acted on (a lease that refuses
-- the group, an Idempotency-Key that is live, a credential that changed
-- since the journal last read it) calls this guard instead, which fails
-- the statement, and so the transaction (the COMMIT after it rolls back),
-- when the group cannot be written as sent. The journal then writes the
-- group the careful way, in two round trips, reading before it writes.
--
-- SQLSTATE TG001 tells the journal that the guard, not a fault, stopped
-- the group. The function is VOLATILE so that the planner never folds a
-- call into a plan-time error.
-- +goose StatementBegin
CREATE FUNCTION lease_journal_guard(ok boolean, what text) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF ok IS NOT TRUE THEN
        RAISE EXCEPTION 'lease journal: %', what USING ERRCODE = 'TG001';
    END IF;
    RETURN true;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION lease_journal_guard(boolean, text);
