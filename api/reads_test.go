package api_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/replica"
	"github.com/tokengate/tokengate/integration/pgtest"
)

// TestReadsGoToTheReadPool: with a reads pool (--read-database-url), the
// ledger query, its export and the drift report read from it, and the
// decisions never do. The reads pool here is another database, standing for
// a standby that has not replayed anything yet, so that where each answer
// came from shows in it.
func TestReadsGoToTheReadPool(t *testing.T) {
	t.Parallel()
	reads := pgtest.New(t, nil)
	b := setupAPI(t, func(c *testConfig) { c.Reads = reads })
	token := b.admin(t, "auditor")
	key := b.tenant(t, "acme", lim(1000, "1"))
	if r := b.call(t, key, http.MethodPost, "/v1/admissions", chat(100, "hi")); r.Code != http.StatusCreated {
		t.Fatalf("admit: %d %s", r.Code, r.Body)
	}
	// The "standby" knows acme as it was created, without the admission.
	if _, err := account.NewStore(reads).CreateTenant(ctx, account.CreateTenantParams{ID: "acme", Limits: lim(1000, "1")}); err != nil {
		t.Fatal(err)
	}

	count := func(pool *pgxpool.Pool, sql string) int {
		t.Helper()
		var n int
		if err := pool.QueryRow(ctx, sql).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	const entries = "SELECT count(*) FROM ledger_entries WHERE tenant_id = 'acme'"
	if p, r := count(b.pool, entries), count(reads, entries); p != 2 || r != 1 {
		t.Fatalf("setup: %d entries on the primary, %d on the reads pool; want 2 and 1", p, r)
	}
	if n := count(reads, "SELECT count(*) FROM admissions"); n != 0 {
		t.Fatalf("a decision wrote to the reads pool: %d admissions there", n)
	}

	var led struct {
		Entries []struct {
			Kind string `json:"kind"`
		} `json:"entries"`
	}
	b.adminCall(t, token, http.MethodGet, "/v1/admin/ledger?tenant=acme", nil).json(&led)
	if len(led.Entries) != 1 || led.Entries[0].Kind != "tenant" {
		t.Fatalf("ledger query: %+v, want the reads pool's one tenant entry", led.Entries)
	}
	r := b.adminCall(t, token, http.MethodGet, "/v1/admin/ledger/export?format=ndjson&tenant=acme", nil)
	if lines := strings.Count(strings.TrimSpace(r.Body.String()), "\n") + 1; r.Code != 200 || lines != 1 {
		t.Fatalf("export: %d, %d lines: %s", r.Code, lines, r.Body)
	}
	var drift struct {
		Rows []struct{} `json:"rows"`
	}
	b.adminCall(t, token, http.MethodGet, "/v1/admin/reports/drift?tenant=acme", nil).json(&drift)
	if len(drift.Rows) != 0 {
		t.Fatalf("drift report: %d rows, want the reads pool's none", len(drift.Rows))
	}
	// The tenant's budget is the decisions', from the primary.
	var bud struct {
		Balances struct {
			OpenReservations int64 `json:"open_reservations"`
		} `json:"balances"`
	}
	if r := b.call(t, key, http.MethodGet, "/v1/budget", ""); r.Code != 200 {
		t.Fatalf("budget: %d %s", r.Code, r.Body)
	} else if r.json(&bud); bud.Balances.OpenReservations != 1 {
		t.Fatalf("budget: %d open reservations, not the primary's 1", bud.Balances.OpenReservations)
	}

	// The lag of a reads pool that is not a standby is 0, and says so.
	if b.rep.Lag == nil {
		t.Fatal("no lag monitor with a reads pool")
	}
	if err := b.rep.Lag.Check(ctx); err != nil {
		t.Fatal(err)
	}
	if l := b.rep.Lag.Last(); !l.OK || l.Standby || l.Seconds != 0 || l.Bytes != 0 {
		t.Fatalf("lag: %+v", l)
	}
	metrics := b.call(t, "", http.MethodGet, "/metrics", "").Body.String()
	for _, want := range []string{"tokengate_read_replica_standby 0", "tokengate_read_replica_up 1", "tokengate_read_replica_lag_bytes 0", "tokengate_read_replica_lag_seconds 0"} {
		if !strings.Contains(metrics, want+"\n") {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

// TestNoReadPoolNoLag: without a reads pool everything reads from the
// primary, and there is no lag to report.
func TestNoReadPoolNoLag(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, nil)
	if b.rep.Lag != nil { // New makes a Lag exactly when it is given a reads pool
		t.Fatalf("lag %v without a reads pool", b.rep.Lag)
	}
	if m := b.call(t, "", http.MethodGet, "/metrics", "").Body.String(); strings.Contains(m, "tokengate_read_replica") {
		t.Fatal("/metrics reports a read replica that is not configured")
	}
}

// TestReadOnlyStoreIsAnOutage: a primary demoted by a failover that still
// answers refuses writes as read-only (SQLSTATE 25006). That is an outage
// for the failure policy: 503 store_unavailable with Retry-After, nothing
// debited, never a 500. While it lasts, the recovery loop does not take the
// read-only node for the store back (the pool connects to writable nodes
// only, as cmd's does); once writes are taken again, decisions resume.
func TestReadOnlyStoreIsAnOutage(t *testing.T) {
	t.Parallel()
	pool := pgtest.New(t, func(cfg *pgxpool.Config) {
		cfg.ConnConfig.ValidateConnect = pgconn.ValidateConnectTargetSessionAttrsReadWrite
	})
	store := account.NewStore(pool)
	b := setupAPI(t, func(c *testConfig) { c.DB, c.Store = pool, store })
	b.pool, b.store = pool, store
	key := b.tenant(t, "acme", lim(1000, "1"))
	if r := b.call(t, key, http.MethodPost, "/v1/admissions", chat(100, "hi")); r.Code != http.StatusCreated {
		t.Fatalf("admit: %d %s", r.Code, r.Body)
	}
	db := pool.Config().ConnConfig.Database
	admin := pgtest.Admin(t)
	if _, err := admin.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{db}.Sanitize()+" SET default_transaction_read_only = on"); err != nil {
		t.Fatal(err)
	}
	// The node is read-only from now on, for sessions that exist too.
	if _, err := admin.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()", db); err != nil {
		t.Fatal(err)
	}
	// Connections the pool still holds are gone; the ones it opens are
	// refused as read-only, and so is anything that writes.
	for i := range 3 {
		r := b.call(t, key, http.MethodPost, "/v1/admissions", chat(100, "hi"))
		e := r.errorBody()
		if r.Code != http.StatusServiceUnavailable || e.Error.Type != "store_unavailable" || r.Header().Get("Retry-After") == "" {
			t.Fatalf("admission %d on a read-only store: %d %s", i, r.Code, r.Body)
		}
	}
	if !b.rep.Admitter.Down() {
		t.Fatal("the admitter does not take the read-only store for an outage")
	}
	b.rep.Admitter.RecoverOnce(ctx)
	if !b.rep.Admitter.Down() {
		t.Fatal("the recovery loop took a read-only node for the store")
	}
	if _, err := admin.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{db}.Sanitize()+" RESET default_transaction_read_only"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for b.rep.Admitter.Down() && time.Now().Before(deadline) {
		b.rep.Admitter.RecoverOnce(ctx)
	}
	if r := b.call(t, key, http.MethodPost, "/v1/admissions", chat(100, "hi")); r.Code != http.StatusCreated {
		t.Fatalf("admit once writable again: %d %s", r.Code, r.Body)
	}
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM ledger_entries WHERE tenant_id = 'acme' AND kind = 'reserve'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Fatalf("%d reserve entries, want the 2 admitted", n)
	}
}

// TestReadsPoolOnAPrimaryChoosesAgain: a reads pool over several hosts
// found on a primary (after a failover promoted the standby it was on)
// drops its connections, so that new ones choose a standby again if one
// answers; at most every 10 s, and never for a one-host URL.
func TestReadsPoolOnAPrimaryChoosesAgain(t *testing.T) {
	t.Parallel()
	primary := pgtest.New(t, nil)
	u, err := url.Parse(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	port := u.Port()
	single := pgtest.Pool(t, u.String(), nil)
	u.Host = "127.0.0.1:" + port + ",localhost:" + port // two hosts, one primary
	multi := pgtest.Pool(t, u.String(), nil)
	for _, p := range []*pgxpool.Pool{single, multi} {
		if err := p.Ping(ctx); err != nil {
			t.Fatal(err)
		}
	}
	ls, lm := replica.NewLag(primary, single), replica.NewLag(primary, multi)
	for _, l := range []*replica.Lag{ls, lm} {
		if err := l.Check(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := single.Stat().TotalConns(); n == 0 {
		t.Fatal("a one-host reads pool dropped its connections")
	}
	if n := multi.Stat().TotalConns(); n != 0 {
		t.Fatalf("a multi-host reads pool on a primary kept %d connections", n)
	}
	// Within 10 s it does not drop them again.
	if err := lm.Check(ctx); err != nil {
		t.Fatal(err)
	}
	if n := multi.Stat().TotalConns(); n == 0 {
		t.Fatal("the reads pool dropped its connections again within 10 s")
	}
}
