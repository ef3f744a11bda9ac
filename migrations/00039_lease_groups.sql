-- +goose Up
-- The compact journal (docs/leasing.md, "The compact journal"): a lease
-- journal group in the groups shape writes its admissions as one row of
-- arrays, not one admissions row each. A leased admission row cost
-- Postgres its heap tuple and six index entries (about 59 us of a keyed
-- admission in a group of 14); a group row with the same keys cost 28
-- (make bench-pgcost). Its admissions are found by their ids, which name
-- the group (rule.AdmissionGroupOf: holder and count, indexed here), and a
-- lease's booking finds its events by its holder's groups above its
-- cursor (replica, seq).
--
-- - seq is drawn from admissions_lease_seq once per group, after the
--   group's lease rows are locked, so a lease's groups commit in seq
--   order; an event's place in its lease's order (admission_lease_books'
--   booked_seq) is seq * 2048 plus its index in the row: 1 to 512 for the
--   admissions, 1024 plus it for the ends (maxGroup is 512 requests).
-- - replica is the holder of every lease the group used (leases.holder).
-- - The admission columns are admissions' (input_tokens is input, and so
--   on), one element per admission in the row's order; the end columns
--   are the ends the group made of admissions of earlier groups, each
--   marked in its group's state row in the same statement, with what
--   their settle entries need of the admission (model, estimate, money,
--   actor), so that a booking reads one row per event.
-- - lease_group_states holds, per group, which of its admissions ended
--   (ended: their index in the row; ended_by, beside it: the seq of the
--   group whose row holds the end, 0 for the exact path, -1 for the
--   sweeper) and open_until, the earliest expiry among the others, which
--   the sweeper reads. An end that leaves open_until as it is updates
--   no indexed column: a HOT update, one per group it touches, not one
--   per admission.
CREATE TABLE lease_groups (
    seq             bigint        PRIMARY KEY,
    replica         text          NOT NULL,
    holder          bigint        NOT NULL,
    count           integer       NOT NULL,
    created_at      timestamptz   NOT NULL,
    ids text[],
    tenant_ids text[],
    lease_ids text[],
    models text[],
    input bigint[],
    output bigint[],
    cost bigint[],
    approximate boolean[],
    input_weight bigint[],
    output_weight bigint[],
    expires_at timestamptz[],
    families text[],
    price_models text[],
    price_from timestamptz[],
    money_estimate bigint[],
    faces text[],
    price_tiers text[],
    actors text[],
    end_ids text[],
    end_leases text[],
    end_input bigint[],
    end_output bigint[],
    end_cost bigint[],
    end_money bigint[],
    end_refund bigint[],
    end_models text[],
    end_estimates bigint[],
    end_money_estimates bigint[],
    end_actors text[],
    -- NULL or empty arrays: a group with no admissions, or no ends.
    CHECK (coalesce(cardinality(ids), 0) + coalesce(cardinality(end_ids), 0) BETWEEN 1 AND 1024
           AND coalesce(cardinality(ids), 0) <= 512 AND coalesce(cardinality(end_ids), 0) <= 512)
);
-- A row is read element by element (an admission by its index, a lease's
-- events out of its arrays): a compressed array is decompressed at every
-- subscript. Rows up to a page stay as they are; a group's row is 3 to 5 kB
-- at the group sizes the journal makes under load.
ALTER TABLE lease_groups SET (toast_tuple_target = 8160);
CREATE INDEX lease_groups_replica_idx ON lease_groups (replica, seq);
CREATE INDEX lease_groups_group_idx ON lease_groups (holder, count);
-- The last seq drawn when a lease was taken: every group that uses it
-- draws a later one (it locks the lease row first), so its booking reads
-- its holder's groups from there.
ALTER TABLE leases ADD COLUMN group_from bigint NOT NULL DEFAULT 0;
CREATE TABLE lease_group_states (
    seq        bigint      PRIMARY KEY,
    ended      integer[]   NOT NULL DEFAULT '{}',
    ended_by   bigint[]    NOT NULL DEFAULT '{}',
    open_until timestamptz
);
CREATE INDEX lease_group_states_open_idx ON lease_group_states (open_until) WHERE open_until IS NOT NULL;
-- An admission of a group row that the exact path or the sweeper needs as
-- a row (a settle past its estimate, a release, another face's end, its
-- expiry) is copied into admissions first, and marked ended in its state
-- row so that the journal no longer ends it (admission_materialize.sql):
-- lease_group is the group it was copied from. Its lease_seq (and
-- lease_end_seq, when the journal ended it) is its event's seq in the
-- group row, which the booking reads there, never from the copy.
ALTER TABLE admissions ADD COLUMN lease_group bigint;
-- The group and place a grouped admission id names (rule.AdmissionGroupOf,
-- for ids read in SQL: an Idempotency-Key's admission); NULLs for any
-- other id. The id's 26 characters of Crockford's base32 are its 128 bits
-- MSB first (and two zero bits): 48 of milliseconds, the local mark, the
-- grouped mark, 40 of holder, 28 of count, 10 of place.
CREATE FUNCTION admission_group(id text, OUT holder bigint, OUT count integer, OUT place integer)
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT CASE WHEN substr(b, 49, 2) = '01' THEN substr(b, 51, 40)::bit(40)::bigint END,
           CASE WHEN substr(b, 49, 2) = '01' THEN substr(b, 91, 28)::bit(28)::integer END,
           CASE WHEN substr(b, 49, 2) = '01' THEN substr(b, 119, 10)::bit(10)::integer END
    FROM (SELECT string_agg(((strpos('0123456789abcdefghjkmnpqrstvwxyz', substr(id, 4 + i, 1)) - 1)::bit(5))::text, '' ORDER BY i) AS b
          FROM generate_series(1, 26) AS i
          WHERE id ~ '^adm_[0-9a-hjkmnp-tv-z]{26}$') x
$$;
-- A group's created_at is its admissions': the drift reports read a range
-- of it, as they read admissions' (00034).
CREATE INDEX lease_groups_created_brin ON lease_groups USING brin (created_at) WITH (autosummarize = on);
-- The admissions of group rows as admissions rows, for the readers of
-- admissions that read many (the drift reports, the dashboard's latest):
-- reserved while open, settled as the journal's ending group row records
-- it once the journal ended it. One the exact path or the sweeper ended,
-- or that a decision copied, is its admissions row, and is left out here.
CREATE VIEW lease_group_admissions AS
SELECT g.ids[i] AS id, g.tenant_ids[i] AS tenant_id, CASE WHEN eg.seq IS NULL THEN 'reserved' ELSE 'settled' END AS state,
       g.models[i] AS model, g.input[i] AS input_tokens, g.output[i] AS output_tokens, g.cost[i] AS cost,
       g.approximate[i] AS approximate, g.input_weight[i] AS input_weight_micro, g.output_weight[i] AS output_weight_micro,
       g.created_at, g.expires_at[i] AS expires_at, eg.created_at AS ended_at, false AS late,
       eg.end_input[j.j] AS actual_input, eg.end_output[j.j] AS actual_output, eg.end_cost[j.j] AS actual_cost,
       eg.end_refund[j.j] AS end_delta_micro, NULL::bigint AS end_balance_micro, '{}'::text[] AS shadowed,
       nullif(g.families[i], '') AS family, '{}'::text[] AS model_levels, NULL::text AS pool_id,
       nullif(g.price_models[i], '') AS price_model, g.price_from[i] AS price_from, nullif(g.price_tiers[i], '') AS price_tier,
       g.money_estimate[i] AS money_estimate, eg.end_money[j.j] AS money_actual, g.faces[i] AS face,
       NULL::bigint AS debited_micro, g.lease_ids[i] AS lease_id, g.seq AS group_seq
FROM lease_groups g
JOIN lease_group_states s ON s.seq = g.seq
CROSS JOIN LATERAL generate_subscripts(g.ids, 1) AS i
CROSS JOIN LATERAL (SELECT s.ended_by[array_position(s.ended, i)] AS ended_by) b
LEFT JOIN LATERAL (SELECT * FROM lease_groups eg WHERE eg.seq = b.ended_by AND b.ended_by > 0 OFFSET 0) eg ON true
CROSS JOIN LATERAL (SELECT array_position(eg.end_ids, g.ids[i]) AS j) j
WHERE (b.ended_by IS NULL OR b.ended_by > 0)
  AND NOT EXISTS (SELECT 1 FROM admissions a WHERE a.id = g.ids[i]);
-- +goose StatementBegin
DO $$
BEGIN
    ALTER TABLE lease_groups ALTER COLUMN ids SET COMPRESSION lz4, ALTER COLUMN tenant_ids SET COMPRESSION lz4,
        ALTER COLUMN lease_ids SET COMPRESSION lz4, ALTER COLUMN models SET COMPRESSION lz4,
        ALTER COLUMN actors SET COMPRESSION lz4, ALTER COLUMN faces SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported THEN
    NULL; -- a server built without lz4 keeps pglz
END
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM lease_groups) THEN
        RAISE EXCEPTION 'leased admissions are journaled as groups: set every tenant''s lease mode off and let them end first';
    END IF;
END
$$;
-- +goose StatementEnd
ALTER TABLE leases DROP COLUMN group_from;
DROP VIEW lease_group_admissions;
DROP FUNCTION admission_group(text);
ALTER TABLE admissions DROP COLUMN lease_group;
DROP TABLE lease_group_states;
DROP TABLE lease_groups;
