-- The credentials of a group sent in one round trip are as the journal
-- last read them (lease_keys.sql, lease_gateways.sql), or the group stops
-- (lease_journal_guard, 00035) and is written the careful way, which reads
-- them afresh. $1 and $2 are the tenant keys and the row versions (xmin)
-- the journal read; $3 and $4 the gateways, unrevoked, and theirs. Any
-- change of a row (a revoke, a new scope, a key's last use) gives it a new
-- xmin, so "the same version" is "the same row", and the journal's rules
-- applied to the rows it read are the rules applied to the rows now. Run
-- after the group locked its leases, as the reads it stands for are (a
-- revoke that locked those leases first is seen).
SELECT lease_journal_guard(
    (SELECT count(*) FROM unnest($1::text[], $2::text[]) AS e (id, v)
     JOIN api_keys k ON k.id = e.id AND k.xmin::text = e.v) = coalesce(cardinality($1::text[]), 0)
    AND (SELECT count(*) FROM unnest($3::text[], $4::text[]) AS e (id, v)
         JOIN gateway_credentials g ON g.id = e.id AND g.xmin::text = e.v AND g.revoked_at IS NULL)
        = coalesce(cardinality($3::text[]), 0),
    'a credential changed since the journal read it')
