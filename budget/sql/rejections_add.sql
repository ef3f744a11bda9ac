INSERT INTO rejection_counts (tenant_id, minute, limit_name, count)
VALUES ($1, $2, $3, $4)
ON CONFLICT (tenant_id, minute, limit_name) DO UPDATE SET count = rejection_counts.count + excluded.count
