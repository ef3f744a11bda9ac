-- +goose Up
-- What an admission's reserve took from its tenant's token balance, when
-- that was less than its estimate: a local admission made during an outage
-- and replayed into the store at the debt floor, where the debit stops.
-- Its settle or release refunds at most that: refunding the whole estimate
-- gave a tenant at the floor what it was never charged (issue 36, item 4).
-- NULL: the whole estimate was debited, as every decision of the store
-- debits it.
ALTER TABLE admissions ADD COLUMN debited_micro bigint CHECK (debited_micro >= 0);

-- +goose Down
ALTER TABLE admissions DROP COLUMN debited_micro;
