package ledger

import (
	"context"
	_ "embed"
	"fmt"

	"github.com/jackc/pgx/v5"
)

var (
	//go:embed sql/entry_insert.sql
	entryInsertSQL string
	//go:embed sql/entry_list.sql
	entryListSQL string
)

// Querier is what reads need: a pool, a connection or a transaction.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// QueueInsert queues the insert of a sealed entry on b, which the caller
// sends inside the transaction that changes the balance.
func QueueInsert(b *pgx.Batch, e *Entry) {
	b.Queue(entryInsertSQL,
		e.TenantID, e.Seq, string(e.Kind), e.CreatedAt, e.AdmissionID, e.Model, e.Estimate, e.Actual,
		e.RefillMicro, e.DeltaMicro, e.BalanceMicro, e.PeriodStart, e.PeriodUsed, e.Late,
		e.Actor, e.Reason, e.Detail, e.PrevHash, e.Hash)
}

// EntryList returns up to limit entries of a tenant with seq > afterSeq, in
// order.
func EntryList(ctx context.Context, q Querier, tenantID string, afterSeq int64, limit int) ([]Entry, error) {
	rows, err := q.Query(ctx, entryListSQL, tenantID, afterSeq, limit)
	if err != nil {
		return nil, fmt.Errorf("ledger: list %s: %w", tenantID, err)
	}
	entries, err := pgx.CollectRows(rows, scanEntry)
	if err != nil {
		return nil, fmt.Errorf("ledger: list %s: %w", tenantID, err)
	}
	return entries, nil
}
