-- The end user of a tenant ($2) that an admission ($1) belongs to: no row
-- when the admission is not one of the tenant's end users'.
SELECT a.tenant_id FROM admissions a JOIN tenants t ON t.id = a.tenant_id
WHERE a.id = $1 AND t.end_user_of = $2
