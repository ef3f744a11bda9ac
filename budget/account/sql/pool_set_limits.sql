UPDATE pools SET tokens_capacity = $2, tokens_rate_micro = $3, tokens_micro = $4, tokens_at = $5 WHERE id = $1
