package ledger

import (
	"context"
	_ "embed"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tokengate/tokengate/ledger/pgarray"
)

var (
	//go:embed sql/entry_insert.sql
	entryInsertSQL string
	//go:embed sql/record_insert.sql
	recordInsertSQL string
)

// Querier is what reads need: a pool, a connection or a transaction.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// QueueInsert queues the insert of sealed entries on b, as one statement,
// which the caller sends inside the transaction that changes the balances.
// Empty strings (no admission, model, reason or detail) are stored as NULL.
// Entries with a Lease are stored in records where they can be
// (recordRuns): a run of one tenant's consecutive entries of one lease
// that agree on the columns a record holds once is one row. It returns how
// many rows the statement inserts.
func QueueInsert(b *pgx.Batch, entries ...*Entry) (rows int) {
	for _, e := range entries {
		if e.Lease != "" {
			return queueRecords(b, entries)
		}
	}
	c := newColumns(len(entries))
	for _, e := range entries {
		c.add(e)
	}
	b.Queue(entryInsertSQL, c.args()...)
	return len(entries)
}

// maxEarlier bounds a record's entries, so that its row stays a few pages
// of TOAST however long the booking.
const maxEarlier = 500

// recordRuns splits entries into rows: each row is an entry, the last of
// its run, and the entries of the run before it. A run is one tenant's
// entries in seq order (the order a transaction appends them, whatever
// other tenants' entries come between), of one lease, sharing created_at,
// delta, balance, period, late and windows: what the row stores once for
// them all.
func recordRuns(entries []*Entry) [][]*Entry {
	var runs [][]*Entry
	open := map[string]int{} // tenant -> its run still open, in runs
	for _, e := range entries {
		if i, ok := open[e.TenantID]; ok {
			run := runs[i]
			last := run[len(run)-1]
			if e.Lease == last.Lease && e.Seq == last.Seq+1 && len(run) <= maxEarlier && sameRecord(last, e) {
				runs[i] = append(run, e)
				continue
			}
			delete(open, e.TenantID)
		}
		runs = append(runs, []*Entry{e})
		if e.Lease != "" {
			open[e.TenantID] = len(runs) - 1
		}
	}
	return runs
}

// sameRecord reports whether b may share a record's row with a: the
// columns the row holds once agree.
func sameRecord(a, b *Entry) bool {
	return a.CreatedAt.Equal(b.CreatedAt) && a.DeltaMicro == b.DeltaMicro && a.BalanceMicro == b.BalanceMicro &&
		a.PeriodUsed == b.PeriodUsed && a.Late == b.Late && a.Windows == b.Windows &&
		(a.PeriodStart == nil) == (b.PeriodStart == nil) && (a.PeriodStart == nil || a.PeriodStart.Equal(*b.PeriodStart))
}

// queueRecords queues entries as rows, some of them records
// (record_insert.sql).
func queueRecords(b *pgx.Batch, entries []*Entry) int {
	runs := recordRuns(entries)
	c := newColumns(len(runs))
	n := len(entries) - len(runs)
	var (
		lease                                         = make([]string, len(runs))
		prev                                          = make([][]byte, len(runs))
		lo, hi                                        = make([]int64, len(runs)), make([]int64, len(runs))
		kind, admission, model, actor, reason, detail = make([]string, 0, n), make([]*string, 0, n), make([]*string, 0, n), make([]string, 0, n), make([]*string, 0, n), make([]*string, 0, n)
		estimate, actual, money                       = make([]*int64, 0, n), make([]*int64, 0, n), make([]*int64, 0, n)
		refill                                        = make([]int64, 0, n)
		hash                                          = make([][]byte, 0, n)
	)
	for i, run := range runs {
		own := run[len(run)-1]
		c.add(own)
		lo[i], hi[i] = int64(len(kind)+1), int64(len(kind)+len(run)-1)
		if len(run) == 1 {
			prev[i] = []byte{}
			continue
		}
		lease[i], prev[i] = own.Lease, run[0].PrevHash
		for _, e := range run[:len(run)-1] {
			kind, admission, model, actor = append(kind, string(e.Kind)), append(admission, orNull(e.AdmissionID)), append(model, orNull(e.Model)), append(actor, e.Actor)
			reason, detail, estimate, actual = append(reason, orNull(e.Reason)), append(detail, orNull(e.Detail)), append(estimate, e.Estimate), append(actual, e.Actual)
			money, refill, hash = append(money, e.MoneyMicro), append(refill, e.RefillMicro), append(hash, e.Hash)
		}
	}
	b.Queue(recordInsertSQL, append(c.args(), pgarray.Texts(lease), pgarray.Byteas(prev), pgarray.Int8s(lo), pgarray.Int8s(hi),
		pgarray.Texts(kind), pgarray.NullTexts(admission), pgarray.NullTexts(model), pgarray.NullInt8s(estimate),
		pgarray.NullInt8s(actual), pgarray.Int8s(refill), pgarray.NullInt8s(money), pgarray.Texts(actor),
		pgarray.NullTexts(reason), pgarray.NullTexts(detail), pgarray.Byteas(hash))...)
	return len(runs)
}

// columns are rows' own entries, one array per column of ledger_rows.
type columns struct {
	tenant, kind, actor               []string
	admission, model, reason, detail  []*string
	seq, refill, delta, balance, used []int64
	estimate, actual                  []*int64
	at                                []time.Time
	periodStart                       []*time.Time
	late                              []bool
	prev, hash                        [][]byte
	money                             []*int64
	windows                           []*string
}

func newColumns(n int) *columns {
	return &columns{
		tenant: make([]string, 0, n), kind: make([]string, 0, n), actor: make([]string, 0, n),
		admission: make([]*string, 0, n), model: make([]*string, 0, n), reason: make([]*string, 0, n), detail: make([]*string, 0, n),
		seq: make([]int64, 0, n), refill: make([]int64, 0, n), delta: make([]int64, 0, n), balance: make([]int64, 0, n), used: make([]int64, 0, n),
		estimate: make([]*int64, 0, n), actual: make([]*int64, 0, n), at: make([]time.Time, 0, n), periodStart: make([]*time.Time, 0, n),
		late: make([]bool, 0, n), prev: make([][]byte, 0, n), hash: make([][]byte, 0, n), money: make([]*int64, 0, n), windows: make([]*string, 0, n),
	}
}

func orNull(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func (c *columns) add(e *Entry) {
	c.tenant, c.seq, c.kind, c.at = append(c.tenant, e.TenantID), append(c.seq, e.Seq), append(c.kind, string(e.Kind)), append(c.at, e.CreatedAt)
	c.admission, c.model, c.estimate, c.actual = append(c.admission, orNull(e.AdmissionID)), append(c.model, orNull(e.Model)), append(c.estimate, e.Estimate), append(c.actual, e.Actual)
	c.refill, c.delta, c.balance, c.periodStart = append(c.refill, e.RefillMicro), append(c.delta, e.DeltaMicro), append(c.balance, e.BalanceMicro), append(c.periodStart, e.PeriodStart)
	c.used, c.late, c.actor, c.reason = append(c.used, e.PeriodUsed), append(c.late, e.Late), append(c.actor, e.Actor), append(c.reason, orNull(e.Reason))
	c.detail, c.prev, c.hash = append(c.detail, orNull(e.Detail)), append(c.prev, e.PrevHash), append(c.hash, e.Hash)
	c.money, c.windows = append(c.money, e.MoneyMicro), append(c.windows, orNull(e.Windows))
}

// args are the columns as entry_insert.sql's parameters ($1-$21).
func (c *columns) args() []any {
	return []any{pgarray.Texts(c.tenant), pgarray.Int8s(c.seq), pgarray.Texts(c.kind), pgarray.Timestamptzs(c.at),
		pgarray.NullTexts(c.admission), pgarray.NullTexts(c.model), pgarray.NullInt8s(c.estimate), pgarray.NullInt8s(c.actual),
		pgarray.Int8s(c.refill), pgarray.Int8s(c.delta), pgarray.Int8s(c.balance), pgarray.NullTimestamptzs(c.periodStart),
		pgarray.Int8s(c.used), c.late, pgarray.Texts(c.actor), pgarray.NullTexts(c.reason), pgarray.NullTexts(c.detail),
		pgarray.Byteas(c.prev), pgarray.Byteas(c.hash), pgarray.NullInt8s(c.money), pgarray.NullTexts(c.windows)}
}
