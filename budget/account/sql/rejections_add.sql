INSERT INTO rejection_counts (tenant_id, minute, limit_name, count, shadow, window_name)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (tenant_id, minute, limit_name, shadow, window_name) DO UPDATE SET count = rejection_counts.count + excluded.count
