-- End users that may have idled out: live, no open reservation, no change
-- for their policy's idle TTL (tokens_at is written by every change). Read
-- without locks; expireEndUser checks again under the end user's lock.
SELECT t.id, t.end_user_of
FROM tenants t JOIN end_user_policies p ON p.tenant_id = t.end_user_of
WHERE t.end_user_of IS NOT NULL AND t.end_user_expired_at IS NULL AND t.open_reservations = 0
  AND t.tokens_at <= coalesce($1::timestamptz, clock_timestamp()) - make_interval(secs => p.idle_ttl_s)
ORDER BY t.tokens_at
LIMIT $2
