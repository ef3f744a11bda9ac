-- Every tenant but end users (listed by their tenant: end_user_list.sql),
-- who may be many thousands.
SELECT * FROM tenants WHERE end_user_of IS NULL ORDER BY id
