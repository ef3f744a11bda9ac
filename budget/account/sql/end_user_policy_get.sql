-- A tenant's end-user policy (no row: none).
SELECT * FROM end_user_policies WHERE tenant_id = $1
