package account_test

import (
	"context"
	"encoding/hex"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/alert"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/integration/pgtest"
	"github.com/tokengate/tokengate/ledger"
	"github.com/tokengate/tokengate/ledger/ledgertest"
)

// ledgerWithHistory makes a tenant with six entries: creation, then
// reserve/settle pairs.
func ledgerWithHistory(t *testing.T) *testBundle {
	t.Helper()
	b := setup(t)
	b.tenant(t, "acme", limits(1000, "1"))
	b.tenant(t, "globex", limits(1000, "1"))
	for _, cost := range []int64{100, 50} {
		r := b.mustReserve(t, "acme", cost)
		if _, err := b.store.Settle(ctx, account.SettleParams{TenantID: "acme", AdmissionID: r.AdmissionID, InputTokens: 10, OutputTokens: 10}); err != nil {
			t.Fatal(err)
		}
	}
	b.mustReserve(t, "acme", 7)
	return b
}

// tamper runs statements as a superuser with the ledger's trigger disabled,
// as someone with direct database access could.
func (b *testBundle) tamper(t *testing.T, stmts ...string) {
	t.Helper()
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	for _, s := range append(append([]string{"ALTER TABLE ledger_rows DISABLE TRIGGER USER"}, stmts...), "ALTER TABLE ledger_rows ENABLE TRIGGER USER") {
		if _, err := tx.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

func auditOf(t *testing.T, b *testBundle, tenant string) account.AuditResult {
	t.Helper()
	res, err := b.store.Audit(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	var found *account.AuditResult
	for i := range res {
		if res[i].TenantID == tenant {
			found = &res[i]
		} else if !res[i].OK {
			t.Fatalf("an untouched tenant fails: %+v", res[i])
		}
	}
	if found == nil {
		t.Fatalf("no result for %s", tenant)
	}
	return *found
}

func TestAuditIntactLedger(t *testing.T) {
	t.Parallel()
	b := ledgerWithHistory(t)
	r := auditOf(t, b, "acme")
	if !r.OK || r.Entries != 6 || r.Problem != "" {
		t.Fatalf("intact ledger: %+v", r)
	}
	if _, err := b.store.Audit(ctx, "nobody"); !errors.Is(err, rule.ErrTenantNotFound) {
		t.Fatalf("unknown tenant: %v", err)
	}
}

func TestAuditCatchesTampering(t *testing.T) {
	t.Parallel()
	// A well-formed forgery: right prev_hash, right hash, right arithmetic,
	// appended after the chain head. Only the tenant row's head exposes it.
	forge := func(b *testBundle, t *testing.T) string {
		entries, err := ledger.EntryList(ctx, b.pool, "acme", 0, 100)
		if err != nil {
			t.Fatal(err)
		}
		last := entries[len(entries)-1]
		h := ledger.Head{Seq: last.Seq, Hash: last.Hash}
		e := ledger.Entry{TenantID: "acme", Kind: ledger.KindAdjust, CreatedAt: last.CreatedAt, DeltaMicro: 1e9,
			BalanceMicro: last.BalanceMicro + 1e9, Actor: "mallory", Reason: "free tokens"}
		h.Seal(&e)
		return "INSERT INTO ledger_rows (tenant_id, seq, kind, created_at, refill_micro, delta_micro, balance_micro, period_used, actor, reason, prev_hash, hash) " +
			"VALUES ('acme', " + itoa(e.Seq) + ", 'adjust', '" + e.CreatedAt.Format("2006-01-02 15:04:05.999999Z07:00") + "', 0, 1000000000, " + itoa(e.BalanceMicro) +
			", 0, 'mallory', 'free tokens', '\\x" + hexOf(e.PrevHash) + "', '\\x" + hexOf(e.Hash) + "')"
	}
	tests := []struct {
		name    string
		tamper  func(b *testBundle, t *testing.T) []string
		seq     int64
		problem string
	}{
		{"amount changed", func(*testBundle, *testing.T) []string {
			return []string{`UPDATE ledger_rows SET estimate = 1, delta_micro = -1000000, balance_micro = balance_micro + 99000000 WHERE tenant_id = 'acme' AND seq = 2`}
		}, 2, "hash"},
		{"entry deleted", func(*testBundle, *testing.T) []string {
			return []string{`DELETE FROM ledger_rows WHERE tenant_id = 'acme' AND seq = 3`}
		}, 3, "missing"},
		{"two entries swapped", func(*testBundle, *testing.T) []string {
			return []string{
				`UPDATE ledger_rows SET seq = 1000 WHERE tenant_id = 'acme' AND seq = 3`,
				`UPDATE ledger_rows SET seq = 3 WHERE tenant_id = 'acme' AND seq = 4`,
				`UPDATE ledger_rows SET seq = 4 WHERE tenant_id = 'acme' AND seq = 1000`,
			}
		}, 3, "prev_hash"},
		{"forged entry with a wrong prev_hash", func(*testBundle, *testing.T) []string {
			return []string{`INSERT INTO ledger_rows (tenant_id, seq, kind, created_at, refill_micro, delta_micro, balance_micro, period_used, actor, prev_hash, hash)
				SELECT tenant_id, 7, 'adjust', created_at, 0, 1000000000, balance_micro + 1000000000, 0, 'mallory', sha256('x'), sha256('y')
				FROM ledger_entries WHERE tenant_id = 'acme' AND seq = 6`}
		}, 7, "prev_hash"},
		{"well-formed forgery past the head", func(b *testBundle, t *testing.T) []string { return []string{forge(b, t)} }, 7, "chain head"},
		{"last entry deleted", func(*testBundle, *testing.T) []string {
			return []string{`DELETE FROM ledger_rows WHERE tenant_id = 'acme' AND seq = 6`}
		}, 6, "chain head"},
		{"balance changed outside the ledger", func(*testBundle, *testing.T) []string {
			return []string{`UPDATE tenants SET tokens_micro = tokens_micro + 500000000 WHERE id = 'acme'`}
		}, 6, "outside the ledger"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := ledgerWithHistory(t)
			b.tamper(t, tt.tamper(b, t)...)
			r := auditOf(t, b, "acme")
			if r.OK || r.BrokenSeq != tt.seq || !strings.Contains(r.Problem, tt.problem) {
				t.Fatalf("audit after %s: %+v, want entry %d named (%q)", tt.name, r, tt.seq, tt.problem)
			}
			// The invariant watch, which reads each row with its ledger's end
			// in a snapshot and the entries outside any, finds the same.
			w := &account.Watch{Store: b.store, Logger: slog.New(slog.DiscardHandler)}
			bad, err := w.Once(ctx)
			if err != nil || len(bad) != 1 || bad[0] != r {
				t.Fatalf("watch after %s: %+v %v, want %+v", tt.name, bad, err, r)
			}
		})
	}
}

func TestWatchIsIncrementalAndLoud(t *testing.T) {
	t.Parallel()
	b := ledgerWithHistory(t)
	var logs strings.Builder
	w := &account.Watch{Store: b.store, Logger: slog.New(slog.NewJSONHandler(&logs, nil))}
	if bad, err := w.Once(ctx); err != nil || len(bad) != 0 {
		t.Fatalf("first watch: %+v %v", bad, err)
	}
	b.mustReserve(t, "acme", 3)
	if bad, err := w.Once(ctx); err != nil || len(bad) != 0 || w.Violations() != 0 {
		t.Fatalf("after an admission: %+v %v", bad, err)
	}
	b.tamper(t, `UPDATE tenants SET tokens_micro = tokens_micro - 1 WHERE id = 'globex'`)
	bad, err := w.Once(ctx)
	if err != nil || len(bad) != 1 || bad[0].TenantID != "globex" || w.Violations() != 1 {
		t.Fatalf("after tampering: %+v %v", bad, err)
	}
}

// TestAuditAndWatchReportOverflow: a balance that wrapped past int64, in a
// chain whose every hash is valid, is an overflow for the audit (ledger
// verify) and for the invariant watch, which logs it and raises the
// invariant rule's event. Before issue 21 both wrapped the same way and
// found the ledger sound.
func TestAuditAndWatchReportOverflow(t *testing.T) {
	t.Parallel()
	b := ledgerWithHistory(t)
	as := alert.NewStore(b.pool, []byte("0123456789abcdef0123456789abcdef"))
	ep, _, err := as.CreateEndpoint(ctx, "https://example.com/hook", "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := as.CreateRule(ctx, alert.RuleParams{EndpointID: ep.ID, Kind: alert.KindInvariant}); err != nil {
		t.Fatal(err)
	}
	var logs strings.Builder
	w := &account.Watch{Store: b.store, Logger: slog.New(slog.NewJSONHandler(&logs, nil)), Alerts: as}
	if err := w.Check(ctx); err != nil || w.Violations() != 0 {
		t.Fatalf("sound ledger: %d violations, %v", w.Violations(), err)
	}
	wr := ledgertest.Wrap(t, b.pool, "acme", "gpt-4o")

	r := auditOf(t, b, "acme")
	if r.OK || r.Kind != ledger.ProblemOverflow || r.BrokenSeq != wr.OverflowSeq || !strings.Contains(r.Problem, "int64") {
		t.Fatalf("audit of a wrapped balance: %+v, want an overflow at entry %d", r, wr.OverflowSeq)
	}
	if err := w.Check(ctx); err != nil || w.Violations() != 1 {
		t.Fatalf("watch: %d violations, %v", w.Violations(), err)
	}
	if !strings.Contains(logs.String(), `"kind":"overflow"`) || !strings.Contains(logs.String(), `"entry":`+itoa(wr.OverflowSeq)) {
		t.Fatalf("the watch did not log the overflow: %s", logs.String())
	}
	es, err := as.Events(ctx, alert.EventFilter{TenantID: "acme", Limit: 10})
	if err != nil || len(es) != 1 || es[0].Type != alert.TypeInvariantViolated || !strings.Contains(string(es[0].Data), "overflow:") {
		t.Fatalf("invariant events: %+v %v", es, err)
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func hexOf(b []byte) string { return hex.EncodeToString(b) }

// TestWatchBesideAppends: the watch reads each tenant's row and ledger end
// in a snapshot of their own and its entries outside any, so it runs
// beside admissions without holding back Postgres's cleanup; appends that
// land between its reads are never findings. Four tenants take 40
// reservations and settles each from eight goroutines while a watch runs
// over and over: it finds nothing, ever, and its last run, the audit and
// the ledger agree on every entry.
func TestWatchBesideAppends(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tenants := []string{"a", "b", "c", "d"}
	for _, id := range tenants {
		b.tenant(t, id, limits(1_000_000, "1000"))
	}
	w := &account.Watch{Store: b.store, Logger: slog.New(slog.DiscardHandler)}
	done := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := tenants[g%len(tenants)]
			for i := range 20 {
				p := reserve(int64(10 + i))
				p.TenantID = id
				r, err := b.store.Reserve(ctx, p)
				if err != nil {
					t.Errorf("reserve %s: %v", id, err)
					return
				}
				if _, err := b.store.Settle(ctx, account.SettleParams{TenantID: id, AdmissionID: r.AdmissionID, InputTokens: 5, OutputTokens: 5}); err != nil {
					t.Errorf("settle %s: %v", id, err)
					return
				}
			}
		}()
	}
	go func() { wg.Wait(); close(done) }()
	runs := 0
	for stop := false; !stop; runs++ {
		select {
		case <-done:
			stop = true // one more run, after the last append
		default:
		}
		bad, err := w.Once(ctx)
		if err != nil || len(bad) != 0 {
			t.Fatalf("watch run %d beside appends: %+v %v", runs, bad, err)
		}
	}
	res, err := b.store.Audit(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		var n int64
		if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM ledger_entries WHERE tenant_id = $1`, r.TenantID).Scan(&n); err != nil {
			t.Fatal(err)
		}
		// Creation, then 2 goroutines x 20 x (reserve + settle).
		if !r.OK || r.Entries != n || n != 1+2*20*2 {
			t.Fatalf("audit of %s after the load: %+v, %d entries in the ledger", r.TenantID, r, n)
		}
	}
	if w.Violations() != 0 || runs < 2 {
		t.Fatalf("watch: %d violations over %d runs", w.Violations(), runs)
	}
}

// snapshotProbe is a query tracer that, as a ledger read of the watch's
// (entry_list.sql) ends, counts the backends of the database other than
// its own that hold a snapshot: the reader's, if its read ran in a
// transaction that keeps one (REPEATABLE READ keeps its first
// statement's to the end).
type snapshotProbe struct {
	check   *pgxpool.Pool
	mu      sync.Mutex
	reading map[*pgx.Conn]bool
	held    []int
}

func (p *snapshotProbe) TraceQueryStart(ctx context.Context, c *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.reading[c] = strings.Contains(d.SQL, "FROM ledger_rows\nWHERE tenant_id = $1 AND seq > $2")
	return ctx
}

func (p *snapshotProbe) TraceQueryEnd(ctx context.Context, c *pgx.Conn, _ pgx.TraceQueryEndData) {
	p.mu.Lock()
	reading := p.reading[c]
	delete(p.reading, c)
	p.mu.Unlock()
	if !reading {
		return
	}
	var n int
	err := p.check.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_xmin IS NOT NULL`).Scan(&n)
	if err != nil {
		n = -1
	}
	p.mu.Lock()
	p.held = append(p.held, n)
	p.mu.Unlock()
}

// TestWatchHoldsNoSnapshotWhileReading: while the watch (or ledger verify)
// reads a tenant's entries, no transaction of its holds a snapshot (one held over a run
// kept Postgres from pruning the rows decisions update, and doubled its
// CPU per request under load: BENCHMARKS.md, "Quota leasing, eleventh
// step"). Every read of entries is checked, in pages of a long chain.
func TestWatchHoldsNoSnapshotWhileReading(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	probe := &snapshotProbe{check: pgtest.Pool(t, url, nil), reading: map[*pgx.Conn]bool{}}
	pool := pgtest.Pool(t, url, func(c *pgxpool.Config) { c.ConnConfig.Tracer = probe })
	b := &testBundle{pool: pool, store: account.NewStore(pool)}
	b.tenant(t, "acme", limits(1_000_000, "1000"))
	for i := range 30 {
		b.mustReserve(t, "acme", int64(1+i))
	}
	w := &account.Watch{Store: b.store, Logger: slog.New(slog.DiscardHandler)}
	if bad, err := w.Once(ctx); err != nil || len(bad) != 0 {
		t.Fatalf("watch: %+v %v", bad, err)
	}
	b.mustReserve(t, "acme", 3)
	if bad, err := w.Once(ctx); err != nil || len(bad) != 0 {
		t.Fatalf("watch: %+v %v", bad, err)
	}
	// So does ledger verify, from the first entry.
	if res, err := b.store.Audit(ctx, "acme"); err != nil || len(res) != 1 || !res[0].OK || res[0].Entries != 32 {
		t.Fatalf("audit: %+v %v", res, err)
	}
	probe.mu.Lock()
	defer probe.mu.Unlock()
	if len(probe.held) < 3 {
		t.Fatalf("the watch read entries %d times, want one a run at least", len(probe.held))
	}
	for i, n := range probe.held {
		if n != 0 {
			t.Fatalf("read %d of the watch: %d backends held a snapshot (%v)", i, n, probe.held)
		}
	}
}
