-- +goose Up
-- What a replica does when it cannot reach this database: answer 503
-- (reject) or admit against its share of the tenant's bucket and replay
-- the admissions here later (local). Set per model (the operation a
-- frontend asks for), else per tenant, else by the server's default.
ALTER TABLE tenants ADD COLUMN on_store_unavailable text CHECK (on_store_unavailable IN ('reject', 'local'));
ALTER TABLE models ADD COLUMN on_store_unavailable text CHECK (on_store_unavailable IN ('reject', 'local'));

-- +goose Down
ALTER TABLE models DROP COLUMN on_store_unavailable;
ALTER TABLE tenants DROP COLUMN on_store_unavailable;
