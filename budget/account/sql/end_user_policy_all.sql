-- Every end-user policy: a replica's copy (EndUserPolicyOf).
SELECT tenant_id, source, header, template, max_end_users, idle_ttl_s, updated_at, updated_by
FROM end_user_policies
