-- A page of a tenant's end users, by tenant id (tenants_end_user_idx finds
-- them; the page is sorted by id after).
SELECT * FROM tenants WHERE end_user_of = $1 AND id > $2 ORDER BY id LIMIT $3
