package api_test

import (
	"context"
	"encoding/csv"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/integration/pgtest"
)

// stopDatabase makes the database of pool as a stopped server is to its
// clients: its sessions are ended (FATAL admin_shutdown, what a shutdown
// sends) and new connections are refused. start undoes it.
func stopDatabase(t *testing.T, pool *pgxpool.Pool) (start func()) {
	t.Helper()
	db := pgx.Identifier{pool.Config().ConnConfig.Database}.Sanitize()
	admin := pgtest.Admin(t)
	if _, err := admin.Exec(ctx, "ALTER DATABASE "+db+" ALLOW_CONNECTIONS false"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
		pool.Config().ConnConfig.Database); err != nil {
		t.Fatal(err)
	}
	start = func() {
		if _, err := admin.Exec(ctx, "ALTER DATABASE "+db+" ALLOW_CONNECTIONS true"); err != nil {
			t.Error(err)
		}
	}
	t.Cleanup(start)
	return start
}

// TestReadsPoolDownFallsBackToThePrimary: with the reads pool's server
// down, the ledger, its exports, the drift report and the tenant's own
// ledger answer from the primary (they answered 500, and an export 200
// with its header alone); once one read found it down, reads go to the
// primary without trying it again, until the lag monitor reaches it; then
// they go back to it.
func TestReadsPoolDownFallsBackToThePrimary(t *testing.T) {
	t.Parallel()
	var attempts atomic.Int64 // connections the reads pool tried to open
	reads := pgtest.New(t, func(cfg *pgxpool.Config) {
		cfg.BeforeConnect = func(context.Context, *pgx.ConnConfig) error { attempts.Add(1); return nil }
	})
	b := setupAPI(t, func(c *testConfig) { c.Reads = reads })
	token := b.admin(t, "auditor")
	key := b.tenant(t, "acme", lim(1000, "1"))
	if r := b.call(t, key, http.MethodPost, "/v1/admissions", chat(100, "hi")); r.Code != http.StatusCreated {
		t.Fatalf("admit: %d %s", r.Code, r.Body)
	}
	entries := func() int {
		t.Helper()
		var led struct {
			Entries []struct{} `json:"entries"`
		}
		r := b.adminCall(t, token, http.MethodGet, "/v1/admin/ledger?tenant=acme", nil)
		if r.Code != http.StatusOK {
			t.Fatalf("ledger: %d %s", r.Code, r.Body)
		}
		r.json(&led)
		return len(led.Entries)
	}
	if n := entries(); n != 0 {
		t.Fatalf("%d entries from the reads pool, which has none", n)
	}

	start := stopDatabase(t, reads)
	if n := entries(); n != 2 {
		t.Fatalf("with the reads pool down: %d entries, want the primary's 2", n)
	}
	if b.rep.ReadsDown() == "" {
		t.Fatal("the reads pool is not marked down")
	}
	tried := attempts.Load()
	r := b.adminCall(t, token, http.MethodGet, "/v1/admin/ledger/export?tenant=acme", nil)
	rows, err := csv.NewReader(strings.NewReader(r.Body.String())).ReadAll()
	if r.Code != http.StatusOK || err != nil || len(rows) != 3 {
		t.Fatalf("CSV export with the reads pool down: %d, %d rows (%v): %s", r.Code, len(rows), err, r.Body)
	}
	r = b.adminCall(t, token, http.MethodGet, "/v1/admin/ledger/export?format=ndjson&tenant=acme", nil)
	if lines := strings.Count(r.Body.String(), "\n"); r.Code != http.StatusOK || lines != 2 {
		t.Fatalf("NDJSON export with the reads pool down: %d, %d lines: %s", r.Code, lines, r.Body)
	}
	for _, path := range []string{"/v1/admin/reports/drift?tenant=acme", "/v1/admin/reports/drift?by=model"} {
		if r := b.adminCall(t, token, http.MethodGet, path, nil); r.Code != http.StatusOK {
			t.Fatalf("%s with the reads pool down: %d %s", path, r.Code, r.Body)
		}
	}
	if r := b.call(t, key, http.MethodGet, "/v1/ledger", ""); r.Code != http.StatusOK || !strings.Contains(r.Body.String(), `"reserve"`) {
		t.Fatalf("the tenant's ledger with the reads pool down: %d %s", r.Code, r.Body)
	}
	if n := attempts.Load(); n != tried {
		t.Fatalf("the reads pool was tried %d more times while marked down", n-tried)
	}
	if m := b.call(t, "", http.MethodGet, "/metrics", "").Body.String(); !strings.Contains(m, "tokengate_read_replica_fallback 1\n") {
		t.Fatal("/metrics does not say the reads go to the primary")
	}

	// The lag monitor finds it down too, then back.
	if err := b.rep.Lag.Check(ctx); err == nil || b.rep.ReadsDown() == "" {
		t.Fatalf("lag check with the reads pool down: %v, down %v", err, b.rep.ReadsDown() != "")
	}
	start()
	if err := b.rep.Lag.Check(ctx); err != nil {
		t.Fatal(err)
	}
	if b.rep.ReadsDown() != "" {
		t.Fatal("the reads pool answered the lag monitor and is still marked down")
	}
	if n := entries(); n != 0 {
		t.Fatalf("with the reads pool back: %d entries, want its 0", n)
	}
}

// TestReadsPoolNeverStartedFallsBack: a reads URL on which no server
// listens (a standby that is stopped) is a fallback to the primary too.
func TestReadsPoolNeverStartedFallsBack(t *testing.T) {
	t.Parallel()
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	reads, err := pgxpool.New(ctx, "postgres://u:p@"+addr+"/standby?connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(reads.Close)
	b := setupAPI(t, func(c *testConfig) { c.Reads = reads })
	token := b.admin(t, "auditor")
	b.tenant(t, "acme", lim(1000, "1"))
	for _, path := range []string{"/v1/admin/ledger?tenant=acme", "/v1/admin/ledger/export?tenant=acme", "/v1/admin/reports/drift?tenant=acme"} {
		r := b.adminCall(t, token, http.MethodGet, path, nil)
		if r.Code != http.StatusOK || !strings.Contains(r.Body.String(), "acme") && !strings.Contains(path, "drift") {
			t.Fatalf("%s with no server behind the reads URL: %d %s", path, r.Code, r.Body)
		}
	}
}

// TestLedgerExportIsNeverAShort200: an export whose first query fails is
// a JSON error, not a 200 with the CSV header alone; one that fails after
// rows went out breaks the connection off, so that the client's read of
// the body fails instead of ending like a whole file.
func TestLedgerExportIsNeverAShort200(t *testing.T) {
	t.Parallel()
	reads := pgtest.New(t, func(cfg *pgxpool.Config) { cfg.ConnConfig.RuntimeParams["lock_timeout"] = "300ms" })
	b := setupAPI(t, func(c *testConfig) { c.Reads = reads })
	token := b.admin(t, "auditor")
	rb := &apiBundle{pool: reads, store: account.NewStore(reads)}
	rb.tenant(t, "acme", lim(1000, "1"))
	rb.tenant(t, "other", lim(1000, "1"))

	// The first query fails (the table is locked past lock_timeout): a
	// JSON error, for CSV and NDJSON alike.
	tx, err := reads.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(ctx) }) // before the pool closes, should the test stop here
	if _, err := tx.Exec(ctx, "LOCK TABLE ledger_entries IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	for _, format := range []string{"csv", "ndjson"} {
		r := b.adminCall(t, token, http.MethodGet, "/v1/admin/ledger/export?format="+format, nil)
		if e := r.errorBody(); r.Code < 500 || e.Error.Type == "" || !strings.HasPrefix(r.Header().Get("Content-Type"), "application/json") {
			t.Fatalf("%s export whose first query fails: %d %q %s", format, r.Code, r.Header().Get("Content-Type"), r.Body)
		}
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	// A row after the first that cannot be read (a created_at of
	// infinity, which no time.Time holds): the rows before it went out.
	if err := pgx.BeginFunc(ctx, reads, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `CREATE TEMP TABLE bad ON COMMIT DROP AS SELECT * FROM ledger_entries WHERE tenant_id = 'other' AND seq = 1;
			UPDATE bad SET tenant_id = 'zzz', created_at = 'infinity';
			INSERT INTO ledger_entries SELECT * FROM bad`)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(b.srv)
	t.Cleanup(srv.Close)
	for _, format := range []string{"csv", "ndjson"} {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/v1/admin/ledger/export?format="+format, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !errors.Is(err, io.ErrUnexpectedEOF) || !strings.Contains(string(body), "other") {
			t.Fatalf("%s export failing mid-stream: %d, read error %v, body %q; want the first rows, then a broken body", format, resp.StatusCode, err, body)
		}
	}
}
