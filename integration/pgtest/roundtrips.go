package pgtest

import (
	"context"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// RoundTrips counts what a pool sends to Postgres: each statement and each
// batch is one round trip. Tests use it to hold a path to its cost, e.g.
// that a face adds no query to the admission it translates.
type RoundTrips struct{ n atomic.Int64 }

// Trace makes the pool's connections report to r: pass it as the
// configure function of New or Pool.
func (r *RoundTrips) Trace(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = r }

// Count is the round trips so far.
func (r *RoundTrips) Count() int64 { return r.n.Load() }

func (r *RoundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	r.n.Add(1)
	return ctx
}

func (r *RoundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (r *RoundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	r.n.Add(1)
	return ctx
}

func (r *RoundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (r *RoundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}
