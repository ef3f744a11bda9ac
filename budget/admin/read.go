package admin

import (
	"context"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
	"github.com/tokengate/tokengate/ledger"
)

// LedgerQuery returns a page of ledger entries a filter selects and the
// cursor of the next page (nil on the last). It reads where reads may lag.
func (s *Service) LedgerQuery(ctx context.Context, f ledger.Filter) ([]ledger.Entry, *ledger.Cursor, error) {
	f, err := s.withLease(ctx, f)
	if err != nil {
		return nil, nil, err
	}
	return ledger.EntryQuery(ctx, s.reads, f)
}

// withLease names the lease of the admission f selects, if it was made
// from one: its booked entries are found through it (ledger.Filter.Lease).
func (s *Service) withLease(ctx context.Context, f ledger.Filter) (ledger.Filter, error) {
	if f.AdmissionID == "" || f.Lease != "" {
		return f, nil
	}
	lease, err := s.store.AdmissionLease(ctx, f.AdmissionID)
	f.Lease = lease
	return f, err
}

// LedgerExport opens an export of every entry a filter selects, where reads
// may lag. The caller closes it.
func (s *Service) LedgerExport(ctx context.Context, f ledger.Filter) (*ledger.Export, error) {
	f, err := s.withLease(ctx, f)
	if err != nil {
		return nil, err
	}
	return ledger.OpenExport(ctx, s.reads, f)
}

// LedgerVerify checks the hash chains of a tenant's ledger (every tenant's
// when tenantID is empty) against the stored heads.
func (s *Service) LedgerVerify(ctx context.Context, tenantID string) ([]account.AuditResult, error) {
	return s.store.Audit(ctx, tenantID)
}

// DriftReport returns how far estimates were from actual usage: the
// admissions' rows, then the batch lines' (DriftRow.Batch), so that a
// tenant's spend in the report includes its batches.
func (s *Service) DriftReport(ctx context.Context, p account.DriftParams) ([]account.DriftRow, error) {
	rows, err := s.store.DriftReport(ctx, p)
	if err != nil {
		return nil, err
	}
	batches, err := s.batches.Drift(ctx, p)
	if err != nil {
		return nil, err
	}
	return append(rows, batches...), nil
}

// Spend is the money each window of some tenants moved in its span.
type Spend struct {
	// Currency is the deployment's (estimator.PriceCurrency).
	Currency string
	// Money holds one amount per window, in micro-units of Currency, in
	// the order of the snapshots and of their windows.
	Money []int64
}

// WindowSpend sums, for every window of snaps, the money the tenant's
// entries moved since the window's start: one ledger query (where reads
// may lag) for them all, whatever their number. Without windows it reads
// nothing and returns a zero Spend.
func (s *Service) WindowSpend(ctx context.Context, snaps ...rule.Snapshot) (Spend, error) {
	var spans []ledger.SpanParams
	for _, snap := range snaps {
		for _, w := range snap.Windows {
			spans = append(spans, ledger.SpanParams{TenantID: snap.TenantID, Since: w.Start})
		}
	}
	if len(spans) == 0 {
		return Spend{}, nil
	}
	money, err := ledger.MoneySpent(ctx, s.reads, spans)
	if err != nil {
		return Spend{}, err
	}
	currency, err := estimator.PriceCurrency(ctx, s.db)
	if err != nil {
		return Spend{}, err
	}
	return Spend{Currency: currency, Money: money}, nil
}
