-- +goose Up
-- Nested budgets: a tenant may have a parent (organisation -> team ->
-- key-level tenant, at most 4 levels). The parent is set at creation and
-- never changes, so `path` (the ancestors, root first) can be read without
-- a lock to find every row an admission must lock, root first.
ALTER TABLE tenants
    ADD COLUMN parent_id text REFERENCES tenants (id),
    ADD COLUMN path text[] NOT NULL DEFAULT '{}',
    ADD COLUMN depth integer NOT NULL DEFAULT 0 CHECK (depth BETWEEN 0 AND 3),
    -- Shadow limits: evaluated and counted on every decision, never refusing.
    ADD COLUMN shadow_limits text[] NOT NULL DEFAULT '{}',
    ADD CONSTRAINT tenants_path_depth CHECK (cardinality(path) = depth),
    ADD CONSTRAINT tenants_parent_depth CHECK ((parent_id IS NULL) = (depth = 0)),
    ADD CONSTRAINT tenants_parent_not_self CHECK (parent_id IS DISTINCT FROM id);
CREATE INDEX tenants_parent_idx ON tenants (parent_id);
-- A tree's tenants, by their root (TenantTree).
CREATE INDEX tenants_root_idx ON tenants ((path[1]));

-- +goose StatementBegin
CREATE FUNCTION tenants_tree_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.parent_id IS DISTINCT FROM OLD.parent_id OR NEW.path IS DISTINCT FROM OLD.path OR NEW.depth <> OLD.depth THEN
        RAISE EXCEPTION 'a tenant''s parent is set at creation and never changes';
    END IF;
    RETURN NEW;
END $$;
-- +goose StatementEnd
CREATE TRIGGER tenants_tree_immutable BEFORE UPDATE ON tenants
    FOR EACH ROW EXECUTE FUNCTION tenants_tree_immutable();

-- The limits a shadow limit would have refused when the admission was
-- made, as "tenant:limit": they were not debited, so the end of the
-- admission does not credit them either.
ALTER TABLE admissions ADD COLUMN shadowed text[] NOT NULL DEFAULT '{}';

-- Shadow refusals are tallied beside real ones.
ALTER TABLE rejection_counts ADD COLUMN shadow boolean NOT NULL DEFAULT false;
ALTER TABLE rejection_counts DROP CONSTRAINT rejection_counts_pkey;
ALTER TABLE rejection_counts ADD PRIMARY KEY (tenant_id, minute, limit_name, shadow);

-- +goose Down
ALTER TABLE rejection_counts DROP CONSTRAINT rejection_counts_pkey;
DELETE FROM rejection_counts WHERE shadow;
ALTER TABLE rejection_counts DROP COLUMN shadow;
ALTER TABLE rejection_counts ADD PRIMARY KEY (tenant_id, minute, limit_name);
ALTER TABLE admissions DROP COLUMN shadowed;
DROP TRIGGER tenants_tree_immutable ON tenants;
DROP FUNCTION tenants_tree_immutable();
DROP INDEX tenants_root_idx;
DROP INDEX tenants_parent_idx;
ALTER TABLE tenants DROP COLUMN shadow_limits, DROP COLUMN depth, DROP COLUMN path, DROP COLUMN parent_id;
