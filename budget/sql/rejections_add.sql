INSERT INTO rejection_counts (tenant_id, minute, limit_name, count, shadow)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (tenant_id, minute, limit_name, shadow) DO UPDATE SET count = rejection_counts.count + excluded.count
