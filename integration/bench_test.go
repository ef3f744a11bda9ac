package integration_test

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tokengate/tokengate/api"
	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/budget/replica"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
	"github.com/tokengate/tokengate/integration/pgtest"
)

// A typical chat request: a system prompt, two turns and a cap, about 1 KB.
var benchBody = []byte(`{"model":"gpt-4o-2024-08-06","max_tokens":256,"messages":[
{"role":"system","content":"You are a careful assistant for a platform team. Answer briefly, cite the runbook section when you can, and never invent configuration flags that do not exist."},
{"role":"user","content":"Our gateway returns 429 for tenant acme although its dashboard shows tokens left. What should I check first, and how do I read the X-RateLimit headers to tell which limit refused the request?"},
{"role":"assistant","content":"Check which limit the 429 body names: tokens, requests, concurrency or period_budget. The token gauge can show room while the request bucket or the concurrency cap is exhausted."},
{"role":"user","content":"It says concurrency. How do I find the reservations that are still open?"}]}`)

func benchStore(b *testing.B, tenants int) (*account.Store, []string) {
	b.Helper()
	pool := pgtest.Pool(b, pgtest.URL(b), func(c *pgxpool.Config) { c.MaxConns = 32 })
	store := account.NewStore(pool)
	ids := make([]string, tenants)
	for i := range ids {
		ids[i] = fmt.Sprintf("bench-%d", i)
		_, err := store.CreateTenant(ctx, account.CreateTenantParams{ID: ids[i], Limits: rule.Limits{
			TokensCapacity: 1_000_000_000_000, TokensRateMicro: 1_000_000 * rule.Micro}})
		if err != nil {
			b.Fatal(err)
		}
	}
	return store, ids
}

// reserveOnce is the reserve path: parse and estimate (before any
// transaction), then the locked transaction.
func reserveOnce(b *testing.B, est *estimator.Estimator, store *account.Store, tenant string) {
	req, err := estimator.Parse(benchBody)
	if err != nil {
		b.Fatal(err)
	}
	e, err := est.Estimate(req)
	if err != nil {
		b.Fatal(err)
	}
	_, err = store.Reserve(ctx, account.ReserveParams{TenantID: tenant, Estimate: e})
	if err != nil {
		b.Fatal(err)
	}
}

// BenchmarkReserve measures one decision at a time: the latency of the
// reserve path.
func BenchmarkReserve(b *testing.B) {
	store, ids := benchStore(b, 1)
	est := estimator.New(nil)
	b.ReportAllocs()
	for b.Loop() {
		reserveOnce(b, est, store, ids[0])
	}
}

// BenchmarkReserveParallelOneTenant is the hot-row case: every goroutine
// spends one tenant's budget, so decisions serialise on its row lock.
func BenchmarkReserveParallelOneTenant(b *testing.B) {
	store, ids := benchStore(b, 1)
	est := estimator.New(nil)
	b.SetParallelism(8)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			reserveOnce(b, est, store, ids[0])
		}
	})
}

// BenchmarkReserveParallelManyTenants spreads decisions over 64 tenants, as
// a gateway serving many teams does.
func BenchmarkReserveParallelManyTenants(b *testing.B) {
	store, ids := benchStore(b, 64)
	est := estimator.New(nil)
	var next atomic.Int64
	b.SetParallelism(8)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			reserveOnce(b, est, store, ids[next.Add(1)%int64(len(ids))])
		}
	})
}

// BenchmarkAdmissionHTTPParallel is the whole server side of one admission,
// in process: the request through every middleware, authentication,
// estimation, the pipeline's batched transaction, and the JSON answer. Its
// allocations per operation are the server's per admission.
func BenchmarkAdmissionHTTPParallel(b *testing.B) {
	store, ids := benchStore(b, 1)
	rep, err := replica.New(replica.Config{DB: store.Pool(), Store: store, Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	srv, err := api.New(rep, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = srv.Close(); rep.Close() })
	_, key, err := credential.KeyCreate(ctx, store.Pool(), ids[0])
	if err != nil {
		b.Fatal(err)
	}
	b.SetParallelism(16)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			req := httptest.NewRequest(http.MethodPost, "/v1/admissions", bytes.NewReader(benchBody))
			req.Header.Set("Authorization", "Bearer "+key)
			req.Header.Set("Content-Type", "application/json")
			rec := httptest.NewRecorder()
			srv.ServeHTTP(rec, req)
			if rec.Code != http.StatusCreated {
				b.Fatalf("%d %s", rec.Code, rec.Body)
			}
		}
	})
}
