-- +goose Up
-- The window that refused a request (limit period_budget), in the tallies
-- of rejections: the dashboard names the window a tenant ran out of, not
-- only "period_budget" beside a period budget it may not have (issue 36).
-- '' for every other limit.
ALTER TABLE rejection_counts ADD COLUMN window_name text NOT NULL DEFAULT '';
ALTER TABLE rejection_counts DROP CONSTRAINT rejection_counts_pkey;
ALTER TABLE rejection_counts ADD PRIMARY KEY (tenant_id, minute, limit_name, shadow, window_name);

-- +goose Down
ALTER TABLE rejection_counts DROP CONSTRAINT rejection_counts_pkey;
DELETE FROM rejection_counts r WHERE window_name <> '' AND EXISTS (
    SELECT 1 FROM rejection_counts s WHERE s.tenant_id = r.tenant_id AND s.minute = r.minute AND s.limit_name = r.limit_name
        AND s.shadow = r.shadow AND s.window_name < r.window_name);
ALTER TABLE rejection_counts DROP COLUMN window_name;
ALTER TABLE rejection_counts ADD PRIMARY KEY (tenant_id, minute, limit_name, shadow);
