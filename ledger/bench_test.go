package ledger_test

import (
	"context"
	_ "embed"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/integration/pgtest"
	"github.com/tokengate/tokengate/ledger"
)

var (
	//go:embed testdata/bench_load.sql
	benchLoadSQL string
	//go:embed testdata/bench_tenants.sql
	benchTenantsSQL string
)

// BenchmarkLedgerScale loads TOKENGATE_BENCH_LEDGER_ROWS entries (default
// 10 million: 1000 tenants of 10 000 entries, valid chains) with
// generate_series, then times a tenant-and-time-range query, exports and a
// full verification. Run it with `make bench-ledger`.
func BenchmarkLedgerScale(b *testing.B) {
	ctx := context.Background()
	rows := 10_000_000
	if v, err := strconv.Atoi(os.Getenv("TOKENGATE_BENCH_LEDGER_ROWS")); err == nil && v > 0 {
		rows = v
	}
	const tenants = 1000
	per := rows / tenants
	pool := pgtest.New(b, func(c *pgxpool.Config) { c.MaxConns = 8 })
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

	// The chain is sequential per tenant, so tenants load in parallel
	// groups, one connection each.
	start := time.Now()
	const groups = 4
	errs := make(chan error, groups)
	for g := range groups {
		go func() {
			from, to := g*tenants/groups+1, (g+1)*tenants/groups
			_, err := pool.Exec(ctx, benchLoadSQL, from, to, per)
			errs <- err
		}()
	}
	for range groups {
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, benchTenantsSQL, per); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE ledger_rows"); err != nil {
		b.Fatal(err)
	}
	var size string
	if err := pool.QueryRow(ctx, "SELECT pg_size_pretty(pg_total_relation_size('ledger_rows'))").Scan(&size); err != nil {
		b.Fatal(err)
	}
	b.Logf("loaded %d entries (%d tenants x %d) in %s; ledger_rows with indexes: %s", tenants*per, tenants, per, time.Since(start).Round(time.Second), size)

	// One tenant's hour (entries are 1 s apart), a quarter into its
	// history: the first page of 100.
	b.Run("query_tenant_hour_page", func(b *testing.B) {
		from := base.Add(time.Duration(per/4) * time.Second)
		f := ledger.Filter{TenantID: "bench-00500", From: from, To: from.Add(time.Hour), Limit: 100}
		timeQueries(b, func() error {
			entries, _, err := ledger.EntryQuery(ctx, pool, f)
			if err == nil && len(entries) != 100 {
				err = fmt.Errorf("%d entries", len(entries))
			}
			return err
		})
	})
	// Every tenant, newest first, a later page through a cursor.
	b.Run("query_all_page_2", func(b *testing.B) {
		_, next, err := ledger.EntryQuery(ctx, pool, ledger.Filter{Limit: 100})
		if err != nil || next == nil {
			b.Fatal(err)
		}
		f := ledger.Filter{Limit: 100, After: next}
		timeQueries(b, func() error {
			_, _, err := ledger.EntryQuery(ctx, pool, f)
			return err
		})
	})
	b.Run("export_tenant_csv", func(b *testing.B) {
		for b.Loop() {
			if err := ledger.WriteCSV(ctx, pool, ledger.Filter{TenantID: "bench-00001"}, io.Discard); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(per)*float64(b.N)/b.Elapsed().Seconds(), "rows/s")
	})
	b.Run("export_all_csv", func(b *testing.B) {
		var peak uint64
		done := make(chan struct{})
		go func() {
			var ms runtime.MemStats
			for {
				select {
				case <-done:
					return
				case <-time.After(100 * time.Millisecond):
					runtime.ReadMemStats(&ms)
					peak = max(peak, ms.HeapInuse)
				}
			}
		}()
		for b.Loop() {
			if err := ledger.WriteCSV(ctx, pool, ledger.Filter{Oldest: true}, io.Discard); err != nil {
				b.Fatal(err)
			}
		}
		close(done)
		b.ReportMetric(float64(tenants*per)*float64(b.N)/b.Elapsed().Seconds(), "rows/s")
		b.ReportMetric(float64(peak)/(1<<20), "peak-heap-MiB")
	})
	b.Run("verify_all", func(b *testing.B) {
		store := account.NewStore(pool)
		for b.Loop() {
			res, err := store.Audit(ctx, "")
			if err != nil || len(res) != tenants {
				b.Fatal(len(res), err)
			}
			for _, r := range res {
				if !r.OK {
					b.Fatalf("%+v", r)
				}
			}
		}
		b.ReportMetric(float64(tenants*per)*float64(b.N)/b.Elapsed().Seconds(), "entries/s")
	})
}

// timeQueries runs query 200 times per iteration (bench-ledger runs each
// sub-benchmark once) and reports the mean time of one.
func timeQueries(b *testing.B, query func() error) {
	const n = 200
	for b.Loop() {
		for range n {
			if err := query(); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(n*b.N)/1000, "ms/query")
}
