SELECT * FROM pool_shares WHERE pool_id = ANY($1::text[])
