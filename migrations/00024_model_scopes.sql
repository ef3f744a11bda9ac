-- +goose Up
-- Model scopes (issue 38): the models a tenant, and each of its keys, may
-- use. Each entry is an exact model name or a glob whose '*' matches any
-- run of characters (rule.ModelMatches); empty: every model. A request's
-- model must pass its key's list and its tenant's and every ancestor's.
-- A decision reads both in its own transaction, under its tenant's row
-- lock (the tenant's with SELECT * FROM tenants, the key's with
-- key_live.sql), and an administrator changes either under that same lock
-- with its ledger entry: every replica applies a change from the next
-- decision on, with no cache to invalidate.
ALTER TABLE tenants ADD COLUMN allowed_models text[] NOT NULL DEFAULT '{}';
ALTER TABLE api_keys ADD COLUMN allowed_models text[] NOT NULL DEFAULT '{}';
-- A batch line follows the same scopes as the request sent alone: the
-- batch allowance's own list of models (00023) is replaced by them.
ALTER TABLE batch_allowances DROP COLUMN models;

-- +goose Down
ALTER TABLE batch_allowances ADD COLUMN models text[] NOT NULL DEFAULT '{}';
ALTER TABLE api_keys DROP COLUMN allowed_models;
ALTER TABLE tenants DROP COLUMN allowed_models;
