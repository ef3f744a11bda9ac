// Package ledgertest writes ledger histories for tests: histories the store
// itself refuses to write, so that the verifier, the reports and the pages
// that read them can be tested against them. It is for tests only.
package ledgertest

import (
	"context"
	"fmt"
	"math/big"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tokengate/tokengate/ledger"
)

// DB is what Wrap needs: a pool (or a connection) to begin a transaction on.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// The wrapped history, as the attack of issue 21 left it: admissions on a
// model of weight 1000 that reserved one cost unit and settled
// WrapUsageTokens of input and of output each, so each settle charged about
// 2e18 micro-tokens and the fifth took the balance past math.MinInt64.
const (
	WrapAdmissions  = 5
	WrapUsageTokens = 1_000_000_000              // input and output each, per admission
	WrapWeightMicro = 1000 * 1_000_000           // the model's weight, input and output
	WrapActualCost  = 2 * WrapUsageTokens * 1000 // cost units per admission
	WrapChargeMicro = (WrapActualCost - 1) * 1_000_000
)

// Wrapped is what Wrap wrote.
type Wrapped struct {
	Admissions []string
	// OverflowSeq is the first entry whose exact balance leaves int64:
	// the one a verifier must name.
	OverflowSeq int64
	// WrappedBalance is the balance the tenant row and that entry hold,
	// wrapped around as int64 arithmetic left it.
	WrappedBalance int64
	// ExactBalance is the balance in exact arithmetic.
	ExactBalance *big.Int
	// The exact sums of the drift report's columns over these admissions.
	ActualInput, ActualOutput, ActualCost, ExtraChargedMicro *big.Int
}

// Wrap appends to tenantID's ledger WrapAdmissions settled admissions of
// model, each a reserve entry and a settle entry, sealed onto the tenant's
// chain, whose settles together charge more than int64 holds: the balance
// wraps around, as tokengate before issue 21 let it. The admissions rows
// and the tenant row's balance and chain head are written to match, in one
// transaction, at the database's clock. Every hash is valid, so only the
// arithmetic is wrong. The tenant must exist; tb fails on any error.
func Wrap(tb testing.TB, db DB, tenantID, model string) Wrapped {
	tb.Helper()
	ctx := context.Background()
	w := Wrapped{ExactBalance: new(big.Int), ActualInput: new(big.Int), ActualOutput: new(big.Int), ActualCost: new(big.Int), ExtraChargedMicro: new(big.Int)}
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		var (
			balance int64
			head    ledger.Head
			now     time.Time
		)
		err := tx.QueryRow(ctx, `SELECT tokens_micro, ledger_seq, ledger_hash, clock_timestamp() FROM tenants WHERE id = $1 FOR UPDATE`, tenantID).
			Scan(&balance, &head.Seq, &head.Hash, &now)
		if err != nil {
			return fmt.Errorf("tenant %s: %w", tenantID, err)
		}
		var periodStart *time.Time
		var periodUsed int64
		if head.Seq > 0 {
			last, err := ledger.EntryList(ctx, tx, tenantID, head.Seq-1, 1)
			if err != nil || len(last) != 1 {
				return fmt.Errorf("last entry of %s: %v (%d)", tenantID, err, len(last))
			}
			periodStart, periodUsed = last[0].PeriodStart, last[0].PeriodUsed
		}
		w.ExactBalance.SetInt64(balance)
		one, actual := int64(1), int64(WrapActualCost)
		b := &pgx.Batch{}
		var entries []*ledger.Entry
		for i := range WrapAdmissions {
			id := fmt.Sprintf("adm_wrapped%s%02d", tenantID, i)
			w.Admissions = append(w.Admissions, id)
			at := now.Add(time.Duration(i) * time.Millisecond).Truncate(time.Microsecond)
			reserve := &ledger.Entry{TenantID: tenantID, Kind: ledger.KindReserve, CreatedAt: at, AdmissionID: id, Model: model,
				Estimate: &one, DeltaMicro: -1_000_000, PeriodStart: periodStart, PeriodUsed: periodUsed, Actor: "tenant:" + tenantID}
			settle := &ledger.Entry{TenantID: tenantID, Kind: ledger.KindSettle, CreatedAt: at, AdmissionID: id, Model: model,
				Estimate: &one, Actual: &actual, DeltaMicro: -WrapChargeMicro, PeriodStart: periodStart, PeriodUsed: periodUsed, Actor: "tenant:" + tenantID}
			for _, e := range []*ledger.Entry{reserve, settle} {
				balance += e.DeltaMicro // wraps, as the store's int64 arithmetic did
				e.BalanceMicro = balance
				head = head.Seal(e)
				w.ExactBalance.Add(w.ExactBalance, big.NewInt(e.DeltaMicro))
				if w.OverflowSeq == 0 && !w.ExactBalance.IsInt64() {
					w.OverflowSeq = e.Seq
				}
				entries = append(entries, e)
			}
			b.Queue(`INSERT INTO admissions (id, tenant_id, state, model, input_tokens, output_tokens, cost, approximate,
				input_weight_micro, output_weight_micro, created_at, expires_at, ended_at, actual_input, actual_output, actual_cost,
				end_delta_micro, end_balance_micro)
				VALUES ($1, $2, 'settled', $3, 1, 0, 1, false, $4, $4, $5::timestamptz, $5::timestamptz + interval '1 minute', $5, $6, $6, $7, $8, $9)`,
				id, tenantID, model, int64(WrapWeightMicro), at, int64(WrapUsageTokens), actual, -int64(WrapChargeMicro), balance)
			w.ActualInput.Add(w.ActualInput, big.NewInt(WrapUsageTokens))
			w.ActualOutput.Add(w.ActualOutput, big.NewInt(WrapUsageTokens))
			w.ActualCost.Add(w.ActualCost, big.NewInt(actual))
			w.ExtraChargedMicro.Add(w.ExtraChargedMicro, big.NewInt(WrapChargeMicro))
		}
		ledger.QueueInsert(b, entries...)
		b.Queue(`UPDATE tenants SET tokens_micro = $2, ledger_seq = $3, ledger_hash = $4 WHERE id = $1`, tenantID, balance, head.Seq, head.Hash)
		w.WrappedBalance = balance
		return tx.SendBatch(ctx, b).Close()
	})
	if err != nil {
		tb.Fatalf("ledgertest: wrap %s: %v", tenantID, err)
	}
	if w.OverflowSeq == 0 {
		tb.Fatalf("ledgertest: wrap %s: the balance did not wrap (it started too high)", tenantID)
	}
	return w
}
