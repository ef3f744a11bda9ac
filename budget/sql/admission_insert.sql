INSERT INTO admissions (
    id, tenant_id, state, model, input_tokens, output_tokens, cost, approximate,
    input_weight_micro, output_weight_micro, created_at, expires_at
) VALUES ($1, $2, 'reserved', $3, $4, $5, $6, $7, $8, $9, $10, $11)
