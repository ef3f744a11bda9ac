-- Deletes a tenant's end-user policy (under the tenant's row lock).
DELETE FROM end_user_policies WHERE tenant_id = $1
