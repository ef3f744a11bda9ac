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

// readHeads lists tenant rows (one, or all with tenantID "") in tx.
func readHeads(ctx context.Context, tx pgx.Tx, tenantID string) ([]head, error) {
	rows, err := tx.Query(ctx, tenantHeadsSQL, tenantID)
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

// Audit verifies every tenant's ledger from its first entry (or one
// tenant's, when tenantID is set) and compares each tenant row with it. It
// returns ErrTenantNotFound for an unknown tenantID.
func (s *Store) Audit(ctx context.Context, tenantID string) ([]AuditResult, error) {
	var out []AuditResult
	err := s.snapshotTx(ctx, func(tx pgx.Tx) error {
		heads, err := readHeads(ctx, tx, tenantID)
		if err != nil {
			return err
		}
		if tenantID != "" && len(heads) == 0 {
			return rule.ErrTenantNotFound
		}
		for _, h := range heads {
			t, verr := ledger.Verify(ctx, tx, h.id)
			if verr != nil && !errors.Is(verr, ledger.ErrBroken) {
				return verr
			}
			out = append(out, h.check(t, verr))
		}
		return nil
	})
	if err != nil {
		if errors.Is(err, rule.ErrTenantNotFound) {
			return nil, err
		}
		return nil, fmt.Errorf("budget: audit: %w", err)
	}
	return out, nil
}

// Watch checks, in every replica and cheaply, that each tenant's stored
// balance and chain head match its ledger: each run verifies only the
// entries appended since the last run (incremental), then compares the row.
// A mismatch is logged as an error on every run until it is resolved and
// counted in Violations.
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
	var bad []AuditResult
	err := w.Store.snapshotTx(ctx, func(tx pgx.Tx) error {
		heads, err := readHeads(ctx, tx, "")
		if err != nil {
			return err
		}
		for _, h := range heads {
			t := w.tallies[h.id]
			if t.LastSeq != h.seq || t.BalanceMicro != h.balance || !bytes.Equal(t.LastHash, h.hash) {
				var verr error
				t, verr = ledger.VerifyFrom(ctx, tx, h.id, t)
				if verr != nil && !errors.Is(verr, ledger.ErrBroken) {
					return verr
				}
				r := h.check(t, verr)
				if !r.OK {
					bad = append(bad, r)
					continue
				}
				w.tallies[h.id] = t
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("budget: watch: %w", err)
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
