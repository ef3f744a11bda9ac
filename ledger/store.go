package ledger

import (
	"context"
	_ "embed"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tokengate/tokengate/ledger/pgarray"
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

// QueueInsert queues the insert of sealed entries on b, as one statement,
// which the caller sends inside the transaction that changes the balances.
// Empty strings (no admission, model, reason or detail) are stored as NULL.
func QueueInsert(b *pgx.Batch, entries ...*Entry) {
	n := len(entries)
	var (
		tenant, kind, actor               = make([]string, n), make([]string, n), make([]string, n)
		admission, model, reason, detail  = make([]*string, n), make([]*string, n), make([]*string, n), make([]*string, n)
		seq, refill, delta, balance, used = make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n)
		estimate, actual                  = make([]*int64, n), make([]*int64, n)
		at                                = make([]time.Time, n)
		periodStart                       = make([]*time.Time, n)
		late                              = make([]bool, n)
		prev, hash                        = make([][]byte, n), make([][]byte, n)
		money                             = make([]*int64, n)
		windows                           = make([]*string, n)
	)
	orNull := func(s string) *string {
		if s == "" {
			return nil
		}
		return &s
	}
	for i, e := range entries {
		tenant[i], seq[i], kind[i], at[i] = e.TenantID, e.Seq, string(e.Kind), e.CreatedAt
		admission[i], model[i], estimate[i], actual[i] = orNull(e.AdmissionID), orNull(e.Model), e.Estimate, e.Actual
		refill[i], delta[i], balance[i], periodStart[i], used[i], late[i] = e.RefillMicro, e.DeltaMicro, e.BalanceMicro, e.PeriodStart, e.PeriodUsed, e.Late
		actor[i], reason[i], detail[i], prev[i], hash[i] = e.Actor, orNull(e.Reason), orNull(e.Detail), e.PrevHash, e.Hash
		money[i], windows[i] = e.MoneyMicro, orNull(e.Windows)
	}
	b.Queue(entryInsertSQL, pgarray.Texts(tenant), pgarray.Int8s(seq), pgarray.Texts(kind), pgarray.Timestamptzs(at),
		pgarray.NullTexts(admission), pgarray.NullTexts(model), pgarray.NullInt8s(estimate), pgarray.NullInt8s(actual),
		pgarray.Int8s(refill), pgarray.Int8s(delta), pgarray.Int8s(balance), pgarray.NullTimestamptzs(periodStart),
		pgarray.Int8s(used), late, pgarray.Texts(actor), pgarray.NullTexts(reason), pgarray.NullTexts(detail),
		pgarray.Byteas(prev), pgarray.Byteas(hash), pgarray.NullInt8s(money), pgarray.NullTexts(windows))
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
