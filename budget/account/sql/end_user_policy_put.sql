-- Writes a tenant's end-user policy (under the tenant's row lock).
INSERT INTO end_user_policies (tenant_id, source, header, template, max_end_users, idle_ttl_s, updated_at, updated_by)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
ON CONFLICT (tenant_id) DO UPDATE
SET source = excluded.source, header = excluded.header, template = excluded.template,
    max_end_users = excluded.max_end_users, idle_ttl_s = excluded.idle_ttl_s,
    updated_at = excluded.updated_at, updated_by = excluded.updated_by
