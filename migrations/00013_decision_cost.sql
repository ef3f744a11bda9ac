-- +goose Up
-- What a decision costs Postgres (issue: decide as cheaply as the peer).
--
-- Every decision updates its tenants' rows (balances, chain head). With
-- the default fillfactor a page holds ~25 tenants, so the new versions of
-- busy tenants soon find their page full: the update leaves the page, is
-- not HOT, and writes an entry in each of the table's indexes; and the
-- batches of every shard contend for the same few pages. Pages filled to a
-- fifth keep room for each row's next versions next to it, so the
-- decision's update stays on its page and touches no index. Tenants are
-- few (thousands at most), so the space is small. CLUSTER rewrites the
-- existing rows with the new fillfactor (inside this transaction, unlike
-- VACUUM FULL).
ALTER TABLE tenants SET (fillfactor = 20);
CLUSTER tenants USING tenants_pkey;
ALTER TABLE tenants SET WITHOUT CLUSTER;

-- The guard that a tenant's place in the tree never changes ran a PL/pgSQL
-- function on every update of a tenant row, every decision's included. Its
-- condition now sits in the trigger's WHEN, which Postgres evaluates
-- without calling the function: the function runs only to refuse.
DROP TRIGGER tenants_tree_immutable ON tenants;
CREATE TRIGGER tenants_tree_immutable BEFORE UPDATE ON tenants
    FOR EACH ROW
    WHEN (NEW.parent_id IS DISTINCT FROM OLD.parent_id OR NEW.path IS DISTINCT FROM OLD.path OR NEW.depth <> OLD.depth)
    EXECUTE FUNCTION tenants_tree_immutable();

-- A foreign key costs each inserted row a query of its own (a trigger that
-- locks the referenced row FOR KEY SHARE): two or three per admission, for
-- rows whose references the decision has just checked itself, under its
-- own lock of the tenant's row (FOR UPDATE), in the same transaction. An
-- admission's tenant is the locked row it was decided on; an idempotency
-- key names the admission inserted beside it in the same statement batch;
-- and tenants are never deleted (they are disabled). The references hold by
-- construction, so the hot path's tables drop the checks; the tables that
-- admins write (keys, limits, pools, alerts) keep theirs.
ALTER TABLE admissions DROP CONSTRAINT admissions_tenant_id_fkey;
ALTER TABLE idempotency_keys DROP CONSTRAINT idempotency_keys_tenant_id_fkey;
ALTER TABLE idempotency_keys DROP CONSTRAINT idempotency_keys_admission_id_fkey;

-- +goose Down
DROP TRIGGER tenants_tree_immutable ON tenants;
CREATE TRIGGER tenants_tree_immutable BEFORE UPDATE ON tenants
    FOR EACH ROW EXECUTE FUNCTION tenants_tree_immutable();
ALTER TABLE idempotency_keys ADD CONSTRAINT idempotency_keys_admission_id_fkey FOREIGN KEY (admission_id) REFERENCES admissions (id);
ALTER TABLE idempotency_keys ADD CONSTRAINT idempotency_keys_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES tenants (id);
ALTER TABLE admissions ADD CONSTRAINT admissions_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES tenants (id);
ALTER TABLE tenants RESET (fillfactor);
