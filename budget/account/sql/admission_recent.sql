SELECT * FROM admissions
WHERE tenant_id = $1
ORDER BY created_at DESC
LIMIT $2
