package account

import (
	"bytes"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/tokengate/tokengate/budget/alert"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/ledger"
)

//go:embed sql/tenant_heads.sql
var tenantHeadsSQL string

// AuditResult is the verification of one tenant: its ledger's chain and
// arithmetic from the first entry, and its row's balance and chain head
// against the ledger's last entry.
type AuditResult struct {
	TenantID string `json:"tenant_id"`
	Entries  int64  `json:"entries"`
	OK       bool   `json:"ok"`
	// BrokenSeq is the first entry that does not hold, or the row's head
	// when the row disagrees with an intact ledger.
	BrokenSeq int64 `json:"broken_seq,omitempty"`
	// Kind classifies the problem: a ledger.ProblemKind (chain,
	// arithmetic, overflow), or ProblemHead or ProblemBalance when the
	// row disagrees with an intact ledger. An overflow is an entry whose
	// exact arithmetic leaves int64: the balance the store wrote wrapped.
	Kind    ledger.ProblemKind `json:"kind,omitempty"`
	Problem string             `json:"problem,omitempty"`
	// BalanceMicro is the balance recomputed from the ledger.
	BalanceMicro int64 `json:"balance_micro"`
}

// The kinds of AuditResult problems that concern the tenant row rather
// than its ledger.
const (
	// ProblemHead: the row's chain head is not the ledger's last entry.
	ProblemHead ledger.ProblemKind = "head"
	// ProblemBalance: the row's balance is not what the ledger recomputes.
	ProblemBalance ledger.ProblemKind = "balance"
)

type head struct {
	id      string
	balance int64
	seq     int64
	hash    []byte
}

// check compares a tenant row with what its ledger recomputes to.
func (h head) check(t ledger.Tally, verr error) AuditResult {
	r := AuditResult{TenantID: h.id, Entries: t.Entries, BalanceMicro: t.BalanceMicro}
	var p *ledger.Problem
	switch {
	case errors.As(verr, &p):
		r.BrokenSeq, r.Kind, r.Problem = p.Seq, p.Kind, p.Reason
	case verr != nil:
		r.Problem = verr.Error()
	case t.LastSeq != h.seq || !bytes.Equal(t.LastHash, h.hash):
		r.BrokenSeq, r.Kind = max(t.LastSeq, h.seq), ProblemHead
		r.Problem = fmt.Sprintf("the tenant row's chain head is entry %d, but the ledger ends at entry %d (entries removed, or forged beyond the head)", h.seq, t.LastSeq)
	case t.BalanceMicro != h.balance:
		r.BrokenSeq, r.Kind = h.seq, ProblemBalance
		r.Problem = fmt.Sprintf("the tenant row holds balance %s, but the ledger recomputes %s: the balance was changed outside the ledger",
			ledger.Tokens(h.balance), ledger.Tokens(t.BalanceMicro))
	default:
		r.OK = true
	}
	return r
}

// readHeads lists tenant rows (one, or all with tenantID "") in q.
func readHeads(ctx context.Context, q ledger.Querier, tenantID string) ([]head, error) {
	rows, err := q.Query(ctx, tenantHeadsSQL, tenantID)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (head, error) {
		var h head
		err := r.Scan(&h.id, &h.balance, &h.seq, &h.hash)
		return h, err
	})
}

// snapshotTx runs fn in a read-only REPEATABLE READ transaction, so the
// tenant rows and the ledger are read as of one instant even while
// admissions go on.
func (s *Store) snapshotTx(ctx context.Context, fn func(pgx.Tx) error) error {
	return pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, fn)
}

// headAndEnd reads a tenant's row and the seq of its ledger's last entry
// in one snapshot, a transaction of two index reads: a head that is not the
// ledger's end is then a finding, not a race with an append.
func (s *Store) headAndEnd(ctx context.Context, tenantID string) (head, int64, error) {
	var h head
	var end int64
	err := s.snapshotTx(ctx, func(tx pgx.Tx) error {
		heads, err := readHeads(ctx, tx, tenantID)
		if err != nil {
			return err
		}
		if len(heads) != 1 {
			return fmt.Errorf("tenant %s: %w", tenantID, rule.ErrTenantNotFound)
		}
		h = heads[0]
		end, err = ledger.LastSeq(ctx, tx, tenantID)
		return err
	})
	return h, end, err
}

// Audit verifies every tenant's ledger from its first entry (or one
// tenant's, when tenantID is set) and compares each tenant row with it. It
// returns ErrTenantNotFound for an unknown tenantID. Like the watch, it
// holds no snapshot while it reads entries (verifyTenant): an audit of a
// large ledger under load would otherwise keep Postgres from pruning the
// rows decisions update for as long as it reads.
func (s *Store) Audit(ctx context.Context, tenantID string) ([]AuditResult, error) {
	heads, err := readHeads(ctx, s.pool, tenantID)
	if err != nil {
		return nil, fmt.Errorf("budget: audit: %w", err)
	}
	if tenantID != "" && len(heads) == 0 {
		return nil, rule.ErrTenantNotFound
	}
	out := make([]AuditResult, 0, len(heads))
	for _, h := range heads {
		r, _, err := s.verifyTenant(ctx, h.id, ledger.Tally{})
		if err != nil {
			return nil, fmt.Errorf("budget: audit: %w", err)
		}
		out = append(out, r)
	}
	return out, nil
}

// verifyTenant verifies a tenant's entries after from (a tally of an
// earlier run, or none) and compares its row with them. It reads the row
// and the seq of the ledger's last entry in one snapshot of two index
// reads, then the entries up to that seq page by page, each page a
// statement of its own: entries are never rewritten, so pages read at
// different moments read one chain, and those up to the end read with the
// row were committed before it was read. Entries appended since are left
// to the next run. Entries beyond the row's head (forged) are verified and
// reported as the chain or the head finds them, as a snapshot would.
func (s *Store) verifyTenant(ctx context.Context, tenantID string, from ledger.Tally) (AuditResult, ledger.Tally, error) {
	h, end, err := s.headAndEnd(ctx, tenantID)
	if err != nil {
		return AuditResult{}, from, err
	}
	t := from
	var verr error
	if end > t.LastSeq {
		t, verr = ledger.VerifyFrom(ctx, s.pool, tenantID, t, end)
		if verr != nil && !errors.Is(verr, ledger.ErrBroken) {
			return AuditResult{}, from, verr
		}
	}
	return h.check(t, verr), t, nil
}

// Watch checks, in every replica and cheaply, that each tenant's stored
// balance and chain head match its ledger: each run verifies only the
// entries appended since the last run (incremental), then compares the row.
// A mismatch is logged as an error on every run until it is resolved and
// counted in Violations.
//
// A run holds no transaction open for long: it reads the tenant rows in one
// statement, then verifies each tenant whose row moved (verifyTenant: its
// row with its ledger's end in a snapshot of two index reads, then its new
// entries page by page, each page a statement of its own). It once read
// everything in one REPEATABLE READ snapshot, which a run over a busy
// ledger held for seconds: while a snapshot is open Postgres cannot prune
// the row versions every decision and journal group leaves behind
// (tenants, leases), and the rate limit service's 64-tenant load spent
// twice its Postgres CPU per request during such a run (BENCHMARKS.md,
// "Quota leasing, eleventh step").
type Watch struct {
	Store  *Store
	Logger *slog.Logger
	// Alerts, when set, raises the invariant rules' events for each
	// violation (once per rule and finding, whatever replica finds it).
	Alerts *alert.Store

	mu         sync.Mutex
	tallies    map[string]ledger.Tally
	violations map[string]AuditResult
}

// Once runs one check and returns the tenants that fail it.
func (w *Watch) Once(ctx context.Context) ([]AuditResult, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.tallies == nil {
		w.tallies, w.violations = map[string]ledger.Tally{}, map[string]AuditResult{}
	}
	heads, err := readHeads(ctx, w.Store.pool, "")
	if err != nil {
		return nil, fmt.Errorf("budget: watch: %w", err)
	}
	var bad []AuditResult
	for _, listed := range heads {
		t := w.tallies[listed.id]
		if t.LastSeq == listed.seq && t.BalanceMicro == listed.balance && bytes.Equal(t.LastHash, listed.hash) {
			continue
		}
		r, next, err := w.Store.verifyTenant(ctx, listed.id, t)
		if err != nil {
			return nil, fmt.Errorf("budget: watch: %w", err)
		}
		if !r.OK {
			bad = append(bad, r)
			continue
		}
		w.tallies[listed.id] = next
	}
	w.violations = map[string]AuditResult{}
	for _, r := range bad {
		w.violations[r.TenantID] = r
	}
	return bad, nil
}

// Violations is how many tenants failed the last check.
func (w *Watch) Violations() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.violations)
}

// Check runs Once and logs every violation loudly; the serve command runs
// it every Interval.
func (w *Watch) Check(ctx context.Context) error {
	bad, err := w.Once(ctx)
	if err != nil {
		return fmt.Errorf("ledger invariant watch: %w", err)
	}
	for _, r := range bad {
		w.Logger.Error("LEDGER INVARIANT VIOLATED: the tenant's stored balance or chain disagrees with its ledger",
			"tenant", r.TenantID, "entry", r.BrokenSeq, "kind", r.Kind, "problem", r.Problem)
		if w.Alerts != nil {
			// The kind leads the problem's text, so an overflow reads as one.
			if _, err := w.Alerts.RaiseInvariant(ctx, r.TenantID, r.BrokenSeq, string(r.Kind)+": "+r.Problem); err != nil {
				return fmt.Errorf("ledger invariant watch: %w", err)
			}
		}
	}
	return nil
}
