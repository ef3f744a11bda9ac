package account

import (
	"context"
	"errors"
	"time"

	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/ledger"
)

// ErrLevelShort is returned by LockedLevels when a move would take a
// level's token balance below zero: a lease may only pre-debit what every
// level holds, never borrow against the debt floor.
var ErrLevelShort = errors.New("budget: a level's balance is short of the debit")

// Level is one level of a tenant's budget tree as a change decided under
// the tree's row locks sees it (LockedLevels): its token balance brought
// to now, and why it cannot be leased, if it cannot.
type Level struct {
	TenantID      string
	BalanceMicro  int64
	CapacityMicro int64
	RateMicro     int64
	// ExactOnly names the first rule of this level that a lease cannot
	// keep ("" when none): budget/lease refuses to lease a tree with one.
	ExactOnly string
}

// LevelMove is a change of one level's token balance with its ledger
// entry: a lease's debit (DeltaMicro < 0) or its refund (> 0), or an entry
// that moves nothing (0: an admission made from a lease, whose cost the
// lease's debit already took). A refund is capped so that the balance does
// not pass capacity; the entry records what was applied.
type LevelMove struct {
	TenantID   string
	Kind       ledger.Kind
	DeltaMicro int64
	Ref        string // the entry's admission_id: the lease's or the admission's id
	Model      string
	Estimate   *int64
	MoneyMicro *int64
	Actor      string
	Reason     string
	Detail     string // JSON
	// Opens: the move books an admission made from a lease, an open
	// reservation at this level from now on, as a reserve's debit counts
	// it (its end frees the slot at each level).
	Opens bool
	// Closes: the move books the end of such an admission made in its
	// lease's journal, which frees its slot; Actual is its actual cost.
	Closes bool
	Actual *int64
	// Lease: the move books an event of this lease; its entry may share
	// a row with the booking's others (ledger.Entry.Lease).
	Lease string
}

// LevelsFunc decides, under the row locks of a tenant and its ancestors,
// at now, the moves to make. Its statements run in q (the tables of a use
// case beside the store, changed in the same serial order as the balances).
// An error rolls everything back.
type LevelsFunc func(ctx context.Context, q LockedQuerier, now time.Time, levels []Level) ([]LevelMove, error)

// LockedLevels runs fn in one transaction holding the row locks of
// tenantID and its ancestors (root first, the one lock order), then applies
// its moves to the levels' token balances, each with its chained ledger
// entry, and commits. It is the one way a use case beside the store
// (budget/lease) moves a balance, so the chain head on the tenant row and
// the stored balance stay equal to the last entry's, as Verify checks. It
// returns the applied moves' deltas (in fn's order), fn's error,
// ErrLevelShort, or rule.ErrTenantNotFound.
func (s *Store) LockedLevels(ctx context.Context, tenantID string, fn LevelsFunc) ([]int64, error) {
	tx, ts, now, err := s.lockTenants(ctx, []string{tenantID}, nil, nil)
	if err != nil {
		return nil, err
	}
	t, ok := ts[tenantID]
	if !ok {
		tx.abort()
		return nil, rule.ErrTenantNotFound
	}
	chain, err := chainOf(ts, t)
	if err != nil {
		tx.abort()
		return nil, err
	}
	levels, byID := levelsOf(chain, now)
	moves, err := fn(ctx, tx.conn, now, levels)
	if err != nil {
		tx.abort()
		return nil, err
	}
	w := &writes{}
	applied, err := applyMoves(byID, moves, now, w)
	if err != nil {
		tx.abort()
		return nil, err
	}
	if w.empty() {
		// fn's own statements still commit.
		w.statement(-1, "SELECT 1")
	}
	if err := tx.commit(ctx, w); err != nil {
		return nil, err
	}
	return applied, nil
}

// exactOnly names the first of t's rules that a lease cannot keep: a lease
// pre-debits the token bucket only, so every rule that counts something
// else, or that decides per request against state other replicas change,
// stays exact in a first version (docs/leasing.md).
func (t *tenant) exactOnly() string {
	switch {
	case t.disabled:
		return "disabled"
	case t.endUserOf != "":
		return "end user"
	case t.Limits.RequestsCapacity > 0:
		return "request limit"
	case t.Limits.MaxConcurrent > 0:
		return "concurrency limit"
	case len(t.Limits.Windows) > 0:
		return "windows"
	case t.modelLimits > 0:
		return "model limits"
	case t.Limits.Shadow != 0:
		return "shadow limits"
	case len(t.models) > 0:
		return "model scope"
	}
	return ""
}
