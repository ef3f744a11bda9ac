-- The admissions a batch settles, releases or expires.
UPDATE admissions a
SET state = u.state, ended_at = u.ended_at, late = u.late, actual_input = u.actual_input,
    actual_output = u.actual_output, actual_cost = u.actual_cost, end_delta_micro = u.end_delta_micro,
    end_balance_micro = u.end_balance_micro, money_actual = u.money_actual
FROM unnest($1::text[], $2::text[], $3::timestamptz[], $4::boolean[], $5::bigint[], $6::bigint[], $7::bigint[],
            $8::bigint[], $9::bigint[], $10::bigint[])
     AS u (id, state, ended_at, late, actual_input, actual_output, actual_cost, end_delta_micro, end_balance_micro,
           money_actual)
WHERE a.id = u.id
