package batch

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/estimator"
	"github.com/tokengate/tokengate/ledger"
)

var (
	//go:embed sql/batch_lock.sql
	batchLockSQL string
	//go:embed sql/batch_enqueued_lines.sql
	batchEnqueuedLinesSQL string
	//go:embed sql/batch_lines_end.sql
	batchLinesEndSQL string
	//go:embed sql/batch_end.sql
	batchEndSQL string
	//go:embed sql/batch_overdue.sql
	batchOverdueSQL string
	//go:embed sql/batch_lines_list.sql
	batchLinesListSQL string
	//go:embed sql/file_owned.sql
	fileOwnedSQL string
)

// The outcomes of a line.
const (
	Succeeded = "succeeded" // settled from the usage its output reported
	Failed    = "failed"    // refunded: it failed, or no output reported it
	Expired   = "expired"   // refunded: the batch expired before it ran
	Cancelled = "cancelled" // refunded: the batch was cancelled before it ran
)

// Result is what the upstream reported of one line: its usage when it
// succeeded, else its outcome (Failed, Expired or Cancelled; "" is
// Failed).
type Result struct {
	CustomID      string
	Succeeded     bool
	Input, Output int64
	// CacheRead, CacheWrite5m and CacheWrite1h are the parts of Input
	// read from and written to the provider's prompt cache (OpenAI's
	// prompt_tokens_details.cached_tokens; Anthropic's cache reads and
	// writes, which its face adds to Input): priced at the model's cache
	// weights and prices, as a single request's are.
	CacheRead, CacheWrite5m, CacheWrite1h int64
	// AtEstimate: it succeeded but reported no usage, so its estimate
	// stands (as a single call's does).
	AtEstimate bool
	Outcome    string
}

// EndParams ends a batch.
type EndParams struct {
	TenantID, BatchID string
	// Status is how the batch ended: completed, failed, expired, cancelled
	// (the upstream's word), or refused (the upstream never accepted it).
	// A line no result names is refunded as Expired or Cancelled after
	// those, else as Failed.
	Status  string
	Results []Result
	// Files are the upstream's files of the batch's end (its output and
	// error files): the tenant may read them (FileOwned).
	Files []string
	Actor string
}

// Summary is what ending a batch did.
type Summary struct {
	// Already: the batch had ended before; nothing moved.
	Already bool
	// Settled lines, their reservation and actual cost; Refunded lines and
	// their reservation. Micro-units at batch prices.
	Settled, Refunded                        int
	SettledMicro, ActualMicro, RefundedMicro int64
	// The money of the priced lines: the settled ones' reservation and
	// actual cost, the refunded ones' reservation (micro-units of the
	// deployment's currency, at the batch price).
	SettledMoney, ActualMoney, RefundedMoney int64
	// priced: some line ended has a price (its entries carry money).
	priced bool
}

// End ends a batch under its tenant's row lock: each line still enqueued
// is settled from its result's usage (bounded as a single request's
// would be: output up to what it reserved, all of it within the model's
// window) or refunded, and all of its reservation given back to the
// allowance. It appends a batch_settle entry for the settled lines and a
// batch_refund entry for the refunded ones. A batch that has ended
// already is left as it is (Summary.Already): reports are idempotent. It
// returns ErrNotFound.
func (s *Service) End(ctx context.Context, p EndParams) (Summary, error) {
	results := make(map[string]Result, len(p.Results))
	for _, r := range p.Results {
		results[r.CustomID] = r
	}
	missing := Failed
	switch p.Status {
	case Expired, Cancelled:
		missing = p.Status
	}
	table := s.est.Table()
	book, err := s.store.PriceBook(ctx)
	if err != nil {
		return Summary{}, err
	}
	var sum Summary
	err = s.store.Locked(ctx, p.TenantID, func(ctx context.Context, q account.LockedQuerier, now time.Time) ([]account.LockedEntry, error) {
		sum = Summary{}
		var state, provider, upstream, outcome string
		var lines int
		var reserved int64
		var created, expires time.Time
		err := q.QueryRow(ctx, batchLockSQL, p.BatchID, p.TenantID).Scan(&state, &provider, &upstream, &lines, &reserved, &created, &expires, &outcome)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, ErrNotFound
		}
		if err != nil {
			return nil, fmt.Errorf("batch: lock: %w", err)
		}
		if state != "open" {
			sum.Already = true
			return nil, nil
		}
		if _, _, err := lockAllowance(ctx, q, p.TenantID); err != nil {
			return nil, err
		}
		rows, err := q.Query(ctx, batchEnqueuedLinesSQL, p.BatchID)
		if err != nil {
			return nil, fmt.Errorf("batch: lines: %w", err)
		}
		open, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (PlannedLine, error) {
			var l PlannedLine
			err := r.Scan(&l.CustomID, &l.Model, &l.InputTokens, &l.OutputTokens, &l.InputWeightMicro, &l.OutputWeightMicro, &l.ReservedMicro, &l.MoneyMicro)
			return l, err
		})
		if err != nil {
			return nil, fmt.Errorf("batch: lines: %w", err)
		}
		n := len(open)
		ids, states, outcomes := make([]string, n), make([]string, n), make([]string, n)
		ain, aout, amicro := make([]*int64, n), make([]*int64, n), make([]*int64, n)
		amoney, cread, cw5, cw1 := make([]*int64, n), make([]*int64, n), make([]*int64, n), make([]*int64, n)
		prices := linePrices{book: book, at: created}
		outcomeCounts := map[string]int{}
		var given int64
		for i, l := range open {
			ids[i] = l.CustomID
			given += l.ReservedMicro
			r, ok := results[l.CustomID]
			if !ok || !r.Succeeded {
				states[i], outcomes[i] = "refunded", missing
				if ok {
					outcomes[i] = Failed
					if r.Outcome == Expired || r.Outcome == Cancelled {
						outcomes[i] = r.Outcome
					}
				}
				outcomeCounts[outcomes[i]]++
				sum.Refunded++
				sum.RefundedMicro += l.ReservedMicro
				if l.MoneyMicro != nil {
					sum.RefundedMoney += *l.MoneyMicro
					sum.priced = true
				}
				continue
			}
			if r.AtEstimate {
				r.Input, r.Output, r.CacheRead, r.CacheWrite5m, r.CacheWrite1h = l.InputTokens, l.OutputTokens, 0, 0, 0
			}
			in, out, _ := account.SettleBounds(estimator.Estimate{Model: l.Model, InputTokens: l.InputTokens, OutputTokens: l.OutputTokens}, table).Clamp(r.Input, r.Output)
			cache := cacheParts(in, estimator.CacheUsage{Read: r.CacheRead, Write5m: r.CacheWrite5m, Write1h: r.CacheWrite1h})
			weighted := in
			if cache != (estimator.CacheUsage{}) {
				m, _ := table.Lookup(l.Model)
				weighted = m.EffectiveCacheInput(in, cache)
			}
			actual := PriceMicro(weighted, out, l.InputWeightMicro, l.OutputWeightMicro)
			states[i], outcomes[i] = "settled", Succeeded
			ain[i], aout[i], amicro[i] = &in, &out, &actual
			cread[i], cw5[i], cw1[i] = &cache.Read, &cache.Write5m, &cache.Write1h
			sum.Settled++
			sum.SettledMicro += l.ReservedMicro
			sum.ActualMicro += actual
			if l.MoneyMicro != nil {
				m, err := prices.cost(l.Model, estimator.MoneyUsage{Input: in, CachedRead: cache.Read, CacheWrite5m: cache.Write5m,
					CacheWrite1h: cache.Write1h, Output: out})
				if err != nil {
					return nil, err
				}
				if m == nil { // the rows are append-only: the price the line was planned at is still there
					return nil, fmt.Errorf("batch: %s lost its price", l.Model)
				}
				amoney[i] = m
				sum.SettledMoney += *l.MoneyMicro
				sum.ActualMoney += *m
				sum.priced = true
			}
		}
		if _, err := q.Exec(ctx, batchLinesEndSQL, p.BatchID, ids, states, outcomes, ain, aout, amicro, amoney, cread, cw5, cw1); err != nil {
			return nil, fmt.Errorf("batch: end lines: %w", err)
		}
		if _, err := q.Exec(ctx, allowanceEnqueueSQL, p.TenantID, -given); err != nil {
			return nil, fmt.Errorf("batch: give back: %w", err)
		}
		if _, err := q.Exec(ctx, batchEndSQL, p.BatchID, now, p.Status, append([]string{}, p.Files...)); err != nil {
			return nil, fmt.Errorf("batch: end: %w", err)
		}
		return s.endEntries(p, sum, outcomeCounts, created)
	})
	if err == nil {
		s.stats.ended(p.Status, sum)
	}
	return sum, err
}

// endEntries are the entries of a batch's end: batch_settle for its lines
// with usage, batch_refund for the others (none for no such line).
func (s *Service) endEntries(p EndParams, sum Summary, outcomes map[string]int, created time.Time) ([]account.LockedEntry, error) {
	var out []account.LockedEntry
	// money is the entry's money moved and windows' correction: estimate
	// ends as actual (0: refunded).
	money := func(e *account.LockedEntry, estimate, actual int64) {
		if !sum.priced {
			return
		}
		moved := actual - estimate
		e.MoneyMicro = &moved
		e.Money = &account.LockedMoney{End: true, Estimate: estimate, Actual: actual, ReservedAt: created}
	}
	if sum.Settled > 0 {
		detail, err := json.Marshal(map[string]any{"event": "settle", "status": p.Status, "lines": sum.Settled,
			"reserved_micro": sum.SettledMicro, "actual_micro": sum.ActualMicro,
			"money_micro": sum.SettledMoney, "actual_money_micro": sum.ActualMoney})
		if err != nil {
			return nil, fmt.Errorf("batch: encode: %w", err)
		}
		e := account.LockedEntry{Kind: ledger.KindBatchSettle, Ref: p.BatchID, Estimate: units(sum.SettledMicro),
			Actual: units(sum.ActualMicro), Actor: p.Actor, Reason: fmt.Sprintf("%d requests settled from the batch's output (%s)", sum.Settled, p.Status),
			Detail: string(detail)}
		money(&e, sum.SettledMoney, sum.ActualMoney)
		out = append(out, e)
	}
	if sum.Refunded > 0 {
		detail, err := json.Marshal(map[string]any{"event": "refund", "status": p.Status, "lines": sum.Refunded,
			"reserved_micro": sum.RefundedMicro, "money_micro": sum.RefundedMoney, "outcomes": outcomes})
		if err != nil {
			return nil, fmt.Errorf("batch: encode: %w", err)
		}
		zero := int64(0)
		e := account.LockedEntry{Kind: ledger.KindBatchRefund, Ref: p.BatchID, Estimate: units(sum.RefundedMicro),
			Actual: &zero, Actor: p.Actor, Reason: fmt.Sprintf("%d requests refunded (%s)", sum.Refunded, p.Status), Detail: string(detail)}
		money(&e, sum.RefundedMoney, 0)
		out = append(out, e)
	}
	return out, nil
}

// ExpireOverdue ends up to limit batches still open after their
// completion window: their enqueued lines are refunded as expired. Every
// replica may run it at once (End is idempotent). It returns how many it
// ended.
func (s *Service) ExpireOverdue(ctx context.Context, limit int) (int, error) {
	now, err := s.now(ctx)
	if err != nil {
		return 0, err
	}
	rows, err := s.store.Pool().Query(ctx, batchOverdueSQL, now, limit)
	if err != nil {
		return 0, fmt.Errorf("batch: overdue: %w", err)
	}
	type overdue struct{ id, tenant string }
	due, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (overdue, error) {
		var o overdue
		return o, r.Scan(&o.id, &o.tenant)
	})
	if err != nil {
		return 0, fmt.Errorf("batch: overdue: %w", err)
	}
	n := 0
	for _, o := range due {
		sum, err := s.End(ctx, EndParams{TenantID: o.tenant, BatchID: o.id, Status: Expired, Actor: "sweeper"})
		if err != nil {
			return n, err
		}
		if !sum.Already {
			n++
		}
	}
	return n, nil
}

// FileOwned says whether an upstream's file is the tenant's to read: an
// input file it uploaded, or a file one of its batches ended with.
func (s *Service) FileOwned(ctx context.Context, provider, fileID, tenantID string) (bool, error) {
	var ok bool
	if err := s.store.Pool().QueryRow(ctx, fileOwnedSQL, provider, fileID, tenantID).Scan(&ok); err != nil {
		return false, fmt.Errorf("batch: file owner: %w", err)
	}
	return ok, nil
}

// LineState is one line of a batch as it stands.
type LineState struct {
	CustomID, Model, State, Outcome string
	ReservedMicro                   int64
	ActualInput, ActualOutput       int64
	ActualMicro                     int64
}

// Lines reads a batch's lines, by custom_id: what an auditor follows a
// batch's ledger entries to.
func (s *Service) Lines(ctx context.Context, batchID string) ([]LineState, error) {
	rows, err := s.store.Pool().Query(ctx, batchLinesListSQL, batchID)
	if err != nil {
		return nil, fmt.Errorf("batch: lines: %w", err)
	}
	ls, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (LineState, error) {
		var l LineState
		return l, r.Scan(&l.CustomID, &l.Model, &l.ReservedMicro, &l.State, &l.Outcome, &l.ActualInput, &l.ActualOutput, &l.ActualMicro)
	})
	if err != nil {
		return nil, fmt.Errorf("batch: lines: %w", err)
	}
	return ls, nil
}
