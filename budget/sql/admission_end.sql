UPDATE admissions
SET state = $2, ended_at = $3, late = $4, actual_input = $5, actual_output = $6, actual_cost = $7,
    end_delta_micro = $8, end_balance_micro = $9
WHERE id = $1
