SELECT * FROM admissions WHERE id = $1 AND tenant_id = $2
