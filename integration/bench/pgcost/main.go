// Command pgcost measures what Postgres spends, in CPU, on the parts of a
// leased admission's write path, one at a time on a quiet database: a
// transaction and its commit, a statement more in the same pipeline, a
// lease journal group's insert (account.QueueLeased, the statement the
// journal sends) by group size, and a booking's ledger entries
// (ledger.QueueInsert) against COPY and against the same table without its
// indexes. The bench loads (peer.sh, side.sh, profile.sh) measure the whole;
// this splits Postgres's share into fixed costs per transaction and costs
// per row, which is what docs/leasing.md's "what binds" is read from.
//
// Postgres's CPU is read from the container's cgroup (--cpu-file), before
// and after each part; the client's CPU is not counted. pgcost.sh starts
// the Postgres and runs it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/ledger"
	"github.com/tokengate/tokengate/ledger/pgarray"
)

func main() {
	url := flag.String("url", "", "the database, migrated")
	cpuFile := flag.String("cpu-file", "", "the Postgres container's cpuacct.usage (ns)")
	groups := flag.Int("groups", 400, "transactions per measurement")
	rounds := flag.Int("rounds", 3, "measurements per part (the median is shown)")
	flag.Parse()
	if err := run(context.Background(), *url, *cpuFile, *groups, *rounds); err != nil {
		fmt.Fprintln(os.Stderr, "pgcost:", err)
		os.Exit(1)
	}
}

// meter reads Postgres's CPU.
type meter string

func (m meter) ns() (int64, error) {
	b, err := os.ReadFile(string(m))
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

// part is one measured part: each call of do is one transaction of n
// units (rows, admissions or statements).
type part struct {
	name, unit string
	n          int
	setup      string // run once before
	do         func(ctx context.Context, c *pgx.Conn) error
}

func run(ctx context.Context, url, cpuFile string, groups, rounds int) error {
	if url == "" || cpuFile == "" {
		return errors.New("--url and --cpu-file are required")
	}
	if groups < 1 || rounds < 1 {
		return errors.New("--groups and --rounds must be at least 1")
	}
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer func() { _ = c.Close(ctx) }()
	for _, q := range []string{
		`INSERT INTO tenants (id, tokens_capacity, tokens_rate_micro, tokens_micro) VALUES ('pgcost', 1000, 1, 0) ON CONFLICT DO NOTHING`,
		`INSERT INTO leases (id, tenant_id, holder, state, levels, slice_micro, taken_at, renewed_at, expires_at)
		 VALUES ('pgcost-lease', 'pgcost', 'pgcost', 'live', ARRAY['pgcost'], 1000000000000, now(), now(), now() + interval '1 day')
		 ON CONFLICT DO NOTHING`,
		`CREATE TABLE IF NOT EXISTS pgcost_small (n int)`,
		`CREATE TABLE IF NOT EXISTS pgcost_ledger (LIKE ledger_rows INCLUDING DEFAULTS)`,
		// ledger_rows with its indexes, its arrays stored out of line
		// uncompressed: what a record's TOAST costs without compression.
		`CREATE TABLE IF NOT EXISTS pgcost_rows_external (LIKE ledger_rows INCLUDING ALL)`,
		// The compact journal's group rows (docs/leasing.md, "The compact
		// journal"): a group's admissions as arrays, in place order.
		`CREATE TABLE IF NOT EXISTS pgcost_groups (
		    holder bigint NOT NULL, n integer NOT NULL, created_at timestamptz NOT NULL,
		    leases text[] NOT NULL, ids text[] NOT NULL, tenants text[] NOT NULL, models text[] NOT NULL,
		    input bigint[] NOT NULL, output bigint[] NOT NULL, cost bigint[] NOT NULL, actors text[] NOT NULL,
		    faces text[] NOT NULL, expires timestamptz[] NOT NULL,
		    PRIMARY KEY (holder, n))`,
		// Holder 1: 1,200 groups of 14 admissions, each of 14 of 64 leases
		// (the rate limit service's 64 tenants), for the booking's read.
		`INSERT INTO pgcost_groups
		 SELECT 1, g, now(), x.leases, x.ids, x.tenants, array_fill('gpt-4o'::text, ARRAY[14]), x.nums, x.nums, x.nums,
		        array_fill('gateway:pgcost'::text, ARRAY[14]), array_fill('rls'::text, ARRAY[14]), array_fill(now() + interval '1 hour', ARRAY[14])
		 FROM generate_series(1, 1200) g CROSS JOIN LATERAL (
		     SELECT array_agg('pgcost-l' || lpad(((g * 7 + i * 5) % 64)::text, 2, '0') ORDER BY i) AS leases,
		            array_agg('adm_' || left(md5(g::text || '.' || i::text), 26) ORDER BY i) AS ids,
		            array_agg('t' || lpad(((g * 7 + i * 5) % 64)::text, 2, '0') ORDER BY i) AS tenants,
		            array_agg((g * 31 + i * 17) % 4000 + 1 ORDER BY i)::bigint[] AS nums
		     FROM generate_series(1, 14) i) x
		 ON CONFLICT DO NOTHING`,
		`ANALYZE pgcost_groups`,
		`ALTER TABLE pgcost_rows_external ALTER COLUMN earlier_kinds SET STORAGE EXTERNAL, ALTER COLUMN earlier_admissions SET STORAGE EXTERNAL,
		 ALTER COLUMN earlier_models SET STORAGE EXTERNAL, ALTER COLUMN earlier_estimates SET STORAGE EXTERNAL,
		 ALTER COLUMN earlier_actuals SET STORAGE EXTERNAL, ALTER COLUMN earlier_refills SET STORAGE EXTERNAL,
		 ALTER COLUMN earlier_money SET STORAGE EXTERNAL, ALTER COLUMN earlier_actors SET STORAGE EXTERNAL,
		 ALTER COLUMN earlier_reasons SET STORAGE EXTERNAL, ALTER COLUMN earlier_details SET STORAGE EXTERNAL,
		 ALTER COLUMN earlier_hashes SET STORAGE EXTERNAL`,
	} {
		if _, err := c.Exec(ctx, q); err != nil {
			return fmt.Errorf("setup: %w", err)
		}
	}
	var seq, adm int64
	small := func(extra int) func(context.Context, *pgx.Conn) error {
		return func(ctx context.Context, c *pgx.Conn) error {
			b := &pgx.Batch{}
			b.Queue("BEGIN")
			b.Queue("INSERT INTO pgcost_small VALUES (1)")
			for range extra {
				b.Queue("SELECT 1")
			}
			b.Queue("COMMIT")
			return c.SendBatch(ctx, b).Close()
		}
	}
	// journalWith writes a journal group of per admissions, their
	// reservation TTL as the replica knows it (ttl; zero: the store reads
	// the tenant's); journal as the replica does, knowing it.
	journalWith := func(per int, keys bool, ttl time.Duration, rewrite ...func(string) string) func(context.Context, *pgx.Conn) error {
		return func(ctx context.Context, c *pgx.Conn) error {
			var l account.Leased
			for range per {
				adm++
				a := &account.Admission{ID: fmt.Sprintf("pgcost-%d-%012d", os.Getpid(), adm), TenantID: "pgcost", Face: "rls"}
				a.Estimate.Model, a.Estimate.InputTokens, a.Estimate.OutputTokens, a.Estimate.Cost = "gpt-4o", 100, 100, 200
				key := ""
				if keys {
					key = fmt.Sprintf("rls:pgcost-%d-%012d", os.Getpid(), adm)
				}
				l.Add("pgcost-lease", "gateway:pgcost", a, key, []byte("hash"), nil, ttl)
			}
			b := &pgx.Batch{}
			b.Queue("BEGIN")
			account.QueueGenericPlans(b)
			account.QueueLeased(b, &l, nil)
			if len(rewrite) > 0 {
				q := b.QueuedQueries[len(b.QueuedQueries)-1]
				q.SQL = rewrite[0](q.SQL)
			}
			b.Queue("COMMIT")
			return c.SendBatch(ctx, b).Close()
		}
	}
	journal := func(per int, keys bool, rewrite ...func(string) string) func(context.Context, *pgx.Conn) error {
		return journalWith(per, keys, 10*time.Minute, rewrite...)
	}
	// groupRow writes a journal group of per admissions, each of its own
	// lease, as the compact journal would: one group row (holder 2) and
	// their key rows.
	var groupNo int
	groupRow := func(per int) func(context.Context, *pgx.Conn) error {
		return func(ctx context.Context, c *pgx.Conn) error {
			groupNo++
			var leases, ids, tenants, models, actors, faces, keys []string
			var nums []int64
			var expires []time.Time
			for i := range per {
				adm++
				id := fmt.Sprintf("pgcost-%d-%012d", os.Getpid(), adm)
				leases, ids, tenants = append(leases, fmt.Sprintf("pgcost-l%02d", i)), append(ids, id), append(tenants, "pgcost")
				models, actors, faces = append(models, "gpt-4o"), append(actors, "gateway:pgcost"), append(faces, "rls")
				keys, nums, expires = append(keys, "rls:"+id), append(nums, 200), append(expires, time.Now().Add(time.Hour))
			}
			b := &pgx.Batch{}
			b.Queue("BEGIN")
			account.QueueGenericPlans(b)
			b.Queue(`WITH c AS (SELECT clock_timestamp() AS at), g AS (
			    INSERT INTO pgcost_groups (holder, n, created_at, leases, ids, tenants, models, input, output, cost, actors, faces, expires)
			    SELECT 2, $1, c.at, $2, $3, $4, $5, $6, $6, $6, $7, $8, $9 FROM c)
			 INSERT INTO idempotency_keys (tenant_id, key, admission_id, request_hash, response, created_at)
			 SELECT u.tenant, u.key, u.id, '\x68'::bytea, '\x'::bytea, c.at FROM unnest($4::text[], $10::text[], $3::text[]) AS u (tenant, key, id) CROSS JOIN c`,
				groupNo, pgarray.Texts(leases), pgarray.Texts(ids), pgarray.Texts(tenants), pgarray.Texts(models), pgarray.Int8s(nums),
				pgarray.Texts(actors), pgarray.Texts(faces), pgarray.Timestamptzs(expires), pgarray.Texts(keys))
			b.Queue("COMMIT")
			return c.SendBatch(ctx, b).Close()
		}
	}
	// A lease's booking reads its admissions since its cursor: from the
	// compact journal's group rows (the holder's groups above the cursor,
	// the lease's places picked out; 1,170 groups hold about 256 of a
	// lease's admissions when each group has 14 of 64 leases), or from
	// admissions rows (admissions_lease_idx, as admission_lease_book.sql).
	// where: "" reads every group row's leases; "any" skips the group rows
	// without the lease before unnesting; "holder" reads every admission of
	// the window (a booking per holder: all its leases at once).
	var bookLease, bookFrom int
	groupsRead := func(where string) func(context.Context, *pgx.Conn) error {
		q := `SELECT g.n, l.place, g.ids[l.place], g.tenants[l.place], g.models[l.place], g.input[l.place],
		        g.output[l.place], g.cost[l.place], g.actors[l.place], g.faces[l.place], g.created_at
		 FROM pgcost_groups g CROSS JOIN LATERAL unnest(g.leases) WITH ORDINALITY AS l (lease, place)
		 WHERE g.holder = 1 AND g.n > $2 AND g.n <= $2 + 1170 AND l.lease = $1`
		want := 200
		switch where {
		case "any":
			q += " AND $1 = ANY (g.leases)"
		case "holder":
			q = strings.Replace(q, "AND l.lease = $1", "AND $1::text IS NOT NULL", 1)
			want = 1170 * 14
		}
		return func(ctx context.Context, c *pgx.Conn) error {
			bookLease = (bookLease + 1) % 64
			bookFrom = (bookFrom + 1) % 30
			rows, err := c.Query(ctx, q, fmt.Sprintf("pgcost-l%02d", bookLease), bookFrom)
			if err != nil {
				return err
			}
			n := 0
			for rows.Next() {
				n++
			}
			if err := rows.Err(); err != nil {
				return err
			}
			if n < want {
				return fmt.Errorf("the booking's read over group rows (%q) found %d admissions, want %d", where, n, want)
			}
			return nil
		}
	}
	var rowsFrom int64
	rowsRead := func(ctx context.Context, c *pgx.Conn) error {
		rows, err := c.Query(ctx, `SELECT id, tenant_id, model, input_tokens, output_tokens, cost, lease_actor, face, created_at, lease_seq
		 FROM admissions WHERE lease_id = 'pgcost-lease' AND lease_seq > $1 ORDER BY lease_seq LIMIT 256`, rowsFrom)
		if err != nil {
			return err
		}
		n := 0
		var last int64
		for rows.Next() {
			var skip [9]any
			if err := rows.Scan(&skip[0], &skip[1], &skip[2], &skip[3], &skip[4], &skip[5], &skip[6], &skip[7], &skip[8], &last); err != nil {
				return err
			}
			n++
		}
		if err := rows.Err(); err != nil {
			return err
		}
		if n < 256 {
			rowsFrom = 0 // start over: the journal parts wrote fewer since
			return nil
		}
		rowsFrom = last
		return nil
	}
	entries := func(n int, lease ...string) []*ledger.Entry {
		out := make([]*ledger.Entry, n)
		head := ledger.Head{Seq: seq, Hash: make([]byte, 32)}
		at := time.Now() // one booking's clock, as applyMoves gives its entries
		for i := range out {
			est := int64(200)
			e := &ledger.Entry{TenantID: "pgcost", Kind: ledger.KindReserve, CreatedAt: at,
				AdmissionID: fmt.Sprintf("pgcost-%d-%012d", os.Getpid(), head.Seq+1), Model: "gpt-4o", Estimate: &est,
				BalanceMicro: 1000, Actor: "lease:pgcost"}
			if len(lease) > 0 {
				e.Lease = lease[0]
			}
			head = head.Seal(e)
			out[i] = e
		}
		seq = head.Seq
		return out
	}
	book := func(n int, table string) func(context.Context, *pgx.Conn) error {
		return func(ctx context.Context, c *pgx.Conn) error {
			b := &pgx.Batch{}
			b.Queue("BEGIN")
			if table == "" {
				ledger.QueueInsert(b, entries(n)...)
			} else {
				inner := &pgx.Batch{}
				ledger.QueueInsert(inner, entries(n)...)
				q := inner.QueuedQueries[0]
				b.Queue(strings.Replace(q.SQL, "INSERT INTO ledger_rows", "INSERT INTO "+table, 1), q.Arguments...)
			}
			b.Queue("COMMIT")
			return c.SendBatch(ctx, b).Close()
		}
	}
	// record books n entries of one lease: one row (00038).
	record := func(n int, table string) func(context.Context, *pgx.Conn) error {
		return func(ctx context.Context, c *pgx.Conn) error {
			b := &pgx.Batch{}
			b.Queue("BEGIN")
			inner := &pgx.Batch{}
			ledger.QueueInsert(inner, entries(n, "pgcost-lease")...)
			q := inner.QueuedQueries[0]
			if table != "" {
				q.SQL = strings.Replace(q.SQL, "INSERT INTO ledger_rows", "INSERT INTO "+table, 1)
			}
			b.Queue(q.SQL, q.Arguments...)
			b.Queue("COMMIT")
			return c.SendBatch(ctx, b).Close()
		}
	}
	copyBook := func(n int) func(context.Context, *pgx.Conn) error {
		cols := []string{"tenant_id", "seq", "kind", "created_at", "admission_id", "model", "estimate", "actual",
			"refill_micro", "delta_micro", "balance_micro", "period_start", "period_used", "late",
			"actor", "reason", "detail", "prev_hash", "hash", "money_micro", "windows"}
		return func(ctx context.Context, c *pgx.Conn) error {
			var rows [][]any
			for _, e := range entries(n) {
				rows = append(rows, []any{e.TenantID, e.Seq, string(e.Kind), e.CreatedAt, e.AdmissionID, e.Model, e.Estimate, e.Actual,
					e.RefillMicro, e.DeltaMicro, e.BalanceMicro, e.PeriodStart, e.PeriodUsed, e.Late,
					e.Actor, nil, nil, e.PrevHash, e.Hash, e.MoneyMicro, nil})
			}
			tx, err := c.Begin(ctx)
			if err != nil {
				return err
			}
			if _, err := tx.CopyFrom(ctx, pgx.Identifier{"ledger_rows"}, cols, pgx.CopyFromRows(rows)); err != nil {
				_ = tx.Rollback(ctx)
				return err
			}
			return tx.Commit(ctx)
		}
	}
	parts := []part{
		{name: "transaction: BEGIN, a one-row insert, COMMIT", unit: "transaction", n: 1, do: small(0)},
		{name: "the same with 4 more statements in its pipeline", unit: "transaction", n: 1, do: small(4)},
		{name: "the same, synchronous_commit off (no flush waited for)", unit: "transaction", n: 1,
			setup: "SET synchronous_commit = off", do: small(0)},
		{name: "journal group insert, 1 admission, no key", unit: "admission", n: 1, do: journal(1, false)},
		{name: "journal group insert, 17 admissions, no key", unit: "admission", n: 17, do: journal(17, false)},
		{name: "journal group insert, 17 admissions with keys", unit: "admission", n: 17, do: journal(17, true)},
		{name: "the same, the keys with ON CONFLICT (a speculative insertion each, as before f32ad70)", unit: "admission", n: 17,
			do: journal(17, true, func(q string) string {
				return q + ` ON CONFLICT (tenant_id, key) DO UPDATE
				SET admission_id = excluded.admission_id, request_hash = excluded.request_hash,
				    response = excluded.response, created_at = excluded.created_at
				WHERE idempotency_keys.created_at <= clock_timestamp() - interval '24 hours'`
			})},
		{name: "the same, the keys' created_at read back from the admissions' RETURNING (as before)", unit: "admission", n: 17,
			do: journal(17, true, func(q string) string {
				for _, r := range [][2]string{
					{"    ORDER BY u.n\n)", "    ORDER BY u.n\n    RETURNING id, created_at\n)"},
					{"u.response, c.at\nFROM", "u.response, a.created_at\nFROM"},
					{"CROSS JOIN c\nWHERE u.key", "JOIN a ON a.id = u.id\nWHERE u.key"},
				} {
					if !strings.Contains(q, r[0]) {
						panic("pgcost: the journal's insert changed: " + r[0])
					}
					q = strings.Replace(q, r[0], r[1], 1)
				}
				return q
			})},
		{name: "journal group insert, 64 admissions with keys", unit: "admission", n: 64, do: journal(64, true)},
		{name: "journal group insert, 14 admissions with keys", unit: "admission", n: 14, do: journal(14, true)},
		{name: "the same, the reservation TTL read from the tenant's row per admission (the store's fallback; before the thirteenth step, a join)", unit: "admission", n: 14,
			do: journalWith(14, true, 0)},
		{name: "the compact journal: 14 admissions with keys as one group row", unit: "admission", n: 14, do: groupRow(14)},
		{name: "booking read: a lease's 256 admissions rows", unit: "admission", n: 256, do: rowsRead},
		{name: "booking read: a lease's 256 admissions in 1,170 group rows", unit: "admission", n: 256, do: groupsRead("")},
		{name: "the same, the group rows without the lease skipped first (= ANY)", unit: "admission", n: 256, do: groupsRead("any")},
		{name: "booking read per holder: every admission of the 1,170 group rows", unit: "admission", n: 1170 * 14, do: groupsRead("holder")},
		{name: "booking: 330 ledger entries, one statement", unit: "entry", n: 330, do: book(330, "")},
		{name: "booking: 330 ledger entries, COPY", unit: "entry", n: 330, do: copyBook(330)},
		{name: "booking: 330 entries of one lease, as one record (00038)", unit: "entry", n: 330, do: record(330, "")},
		{name: "the same, compressed with lz4", unit: "entry", n: 330, setup: "SET default_toast_compression = lz4", do: record(330, "")},
		{name: "the same, stored out of line uncompressed", unit: "entry", n: 330, do: record(330, "pgcost_rows_external")},
		{name: "booking: 20 ledger entries, one statement", unit: "entry", n: 20, do: book(20, "")},
		{name: "booking: 20 entries of one lease, as one record (00038)", unit: "entry", n: 20, do: record(20, "")},
		{name: "the same, compressed with lz4", unit: "entry", n: 20, setup: "SET default_toast_compression = lz4", do: record(20, "")},
		{name: "the same, stored out of line uncompressed", unit: "entry", n: 20, do: record(20, "pgcost_rows_external")},
		{name: "booking: 330 entries into the table without indexes", unit: "entry", n: 330, do: book(330, "pgcost_ledger")},
	}
	m := meter(cpuFile)
	// Rounds are interleaved (every part once, then every part again), so
	// that what a part leaves behind (a table grown, autovacuum started,
	// a checkpoint) falls on every part alike, not on the parts measured
	// after it; each part's setup runs before each of its measurements.
	per := make([][]float64, len(parts))
	for range rounds {
		for i, p := range parts {
			for _, q := range []string{"RESET synchronous_commit", "RESET default_toast_compression", p.setup} {
				if q == "" {
					continue
				}
				if _, err := c.Exec(ctx, q); err != nil {
					return fmt.Errorf("%s: %w", p.name, err)
				}
			}
			before, err := m.ns()
			if err != nil {
				return err
			}
			for range groups {
				if err := p.do(ctx, c); err != nil {
					return fmt.Errorf("%s: %w", p.name, err)
				}
			}
			after, err := m.ns()
			if err != nil {
				return err
			}
			per[i] = append(per[i], float64(after-before)/1e3/float64(groups))
		}
	}
	fmt.Println("| part | Postgres CPU per transaction (us) | per unit |\n|---|---|---|")
	for i, p := range parts {
		slices.Sort(per[i])
		med := per[i][len(per[i])/2]
		fmt.Printf("| %s | %.0f | %.1f us per %s |\n", p.name, med, med/float64(p.n), p.unit)
	}
	return nil
}
