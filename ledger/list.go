package ledger

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

var (
	//go:embed sql/entry_list.sql
	entryListSQL string
	//go:embed sql/entry_next_row.sql
	entryNextRowSQL string
	//go:embed sql/entry_last_seq.sql
	entryLastSeqSQL string
)

// LastSeq returns the seq of a tenant's last entry, 0 for none. Read in
// the snapshot its tenant row is read in, it says whether the row's chain
// head is the ledger's end (account.Watch).
func LastSeq(ctx context.Context, q Querier, tenantID string) (int64, error) {
	rows, err := q.Query(ctx, entryLastSeqSQL, tenantID)
	if err != nil {
		return 0, fmt.Errorf("ledger: last seq of %s: %w", tenantID, err)
	}
	seq, err := pgx.CollectExactlyOneRow(rows, pgx.RowTo[int64])
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return 0, nil
	case err != nil:
		return 0, fmt.Errorf("ledger: last seq of %s: %w", tenantID, err)
	}
	return seq, nil
}

// EntryList returns a tenant's entries with seq > afterSeq, in order: those
// of the rows that end within the next limit seqs, whole, or, when no row
// ends there (a record longer than limit), the next row's. It returns
// fewer than limit entries when a record straddles the range's end (the
// next call starts with it), and none only at the end of the chain. It
// reads ledger_rows and expands each record itself (see entry_list.sql).
func EntryList(ctx context.Context, q Querier, tenantID string, afterSeq int64, limit int) ([]Entry, error) {
	entries, err := listRows(ctx, q, tenantID, afterSeq, entryListSQL, tenantID, afterSeq, afterSeq+int64(max(limit, 1)))
	if err == nil && len(entries) == 0 {
		entries, err = listRows(ctx, q, tenantID, afterSeq, entryNextRowSQL, tenantID, afterSeq)
	}
	if err != nil {
		return nil, fmt.Errorf("ledger: list %s: %w", tenantID, err)
	}
	return entries, nil
}

// listRows runs one of the row reads and expands the rows' entries after
// afterSeq.
func listRows(ctx context.Context, q Querier, tenantID string, afterSeq int64, sql string, args ...any) ([]Entry, error) {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var entries []Entry
	for rows.Next() {
		// A row of its own each time: its entries keep its byte slices.
		var r storedRow
		if err := rows.Scan(r.dest()...); err != nil {
			return nil, err
		}
		entries, err = r.expand(entries, tenantID, afterSeq)
		if err != nil {
			return nil, err
		}
	}
	return entries, rows.Err()
}

// storedRow is a ledger_rows row as entry_list.sql reads it: its own entry,
// and a record's earlier ones as arrays (nil for a row of one entry).
type storedRow struct {
	seq                    int64
	kind                   string
	createdAt              time.Time
	admission, model       pgtype.Text
	estimate, actual       pgtype.Int8
	refill, delta, balance int64
	periodStart            pgtype.Timestamptz
	periodUsed             int64
	late                   bool
	actor                  string
	reason, detail         pgtype.Text
	prevHash, hash         []byte
	money                  pgtype.Int8
	windows                pgtype.Text
	earlierPrev            []byte
	kinds                  []string
	admissions, models     []pgtype.Text
	estimates, actuals     []pgtype.Int8
	refills                []int64
	moneys                 []pgtype.Int8
	actors                 []string
	reasons, details       []pgtype.Text
	hashes                 [][]byte
}

func (r *storedRow) dest() []any {
	return []any{&r.seq, &r.kind, &r.createdAt, &r.admission, &r.model, &r.estimate, &r.actual, &r.refill, &r.delta,
		&r.balance, &r.periodStart, &r.periodUsed, &r.late, &r.actor, &r.reason, &r.detail, &r.prevHash, &r.hash,
		&r.money, &r.windows, &r.earlierPrev, &r.kinds, &r.admissions, &r.models, &r.estimates, &r.actuals,
		&r.refills, &r.moneys, &r.actors, &r.reasons, &r.details, &r.hashes}
}

// expand appends the row's entries after afterSeq to entries: a record's
// earlier ones first (seq counted back from the row's), each with its own
// kind, admission, model, amounts, actor, reason, detail and hash and the
// row's shared columns, as the ledger_entries view gives them.
func (r *storedRow) expand(entries []Entry, tenantID string, afterSeq int64) ([]Entry, error) {
	n := len(r.hashes)
	if len(r.kinds) != n || len(r.admissions) != n || len(r.models) != n || len(r.estimates) != n || len(r.actuals) != n ||
		len(r.refills) != n || len(r.moneys) != n || len(r.actors) != n || len(r.reasons) != n || len(r.details) != n {
		// ledger_rows_earlier_check forbids it; said rather than read past.
		return nil, fmt.Errorf("row %d: its record's arrays differ in length", r.seq)
	}
	shared := Entry{TenantID: tenantID, CreatedAt: r.createdAt, DeltaMicro: r.delta, BalanceMicro: r.balance,
		PeriodStart: timePtr(r.periodStart), PeriodUsed: r.periodUsed, Late: r.late, Windows: r.windows.String}
	for i := range n {
		seq := r.seq - int64(n-i)
		if seq <= afterSeq {
			continue
		}
		e := shared
		e.Seq, e.Kind, e.AdmissionID, e.Model = seq, Kind(r.kinds[i]), r.admissions[i].String, r.models[i].String
		e.Estimate, e.Actual, e.RefillMicro, e.MoneyMicro = int8Ptr(r.estimates[i]), int8Ptr(r.actuals[i]), r.refills[i], int8Ptr(r.moneys[i])
		e.Actor, e.Reason, e.Detail, e.Hash = r.actors[i], r.reasons[i].String, r.details[i].String, r.hashes[i]
		if i == 0 {
			e.PrevHash = r.earlierPrev
		} else {
			e.PrevHash = r.hashes[i-1]
		}
		entries = append(entries, e)
	}
	if r.seq <= afterSeq {
		return entries, nil
	}
	e := shared
	e.Seq, e.Kind, e.AdmissionID, e.Model = r.seq, Kind(r.kind), r.admission.String, r.model.String
	e.Estimate, e.Actual, e.RefillMicro, e.MoneyMicro = int8Ptr(r.estimate), int8Ptr(r.actual), r.refill, int8Ptr(r.money)
	e.Actor, e.Reason, e.Detail, e.PrevHash, e.Hash = r.actor, r.reason.String, r.detail.String, r.prevHash, r.hash
	return append(entries, e), nil
}

func int8Ptr(v pgtype.Int8) *int64 {
	if !v.Valid {
		return nil
	}
	n := v.Int64
	return &n
}

func timePtr(v pgtype.Timestamptz) *time.Time {
	if !v.Valid {
		return nil
	}
	t := v.Time
	return &t
}
