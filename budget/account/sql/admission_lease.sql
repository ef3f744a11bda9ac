SELECT coalesce(lease_id, '') FROM admissions WHERE id = $1
