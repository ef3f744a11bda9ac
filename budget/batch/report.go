package batch

import (
	"context"
	_ "embed"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tokengate/tokengate/budget/account"
)

//go:embed sql/batch_drift.sql
var batchDriftSQL string

// Drift is the drift report of batch lines, row for row as
// account.Store.DriftReport reports admissions (each line counts as an
// admission), every row Batch: the lines of the batches created in
// [p.From, p.To), their estimates, what they used, and their money at the
// batch price, so that a report of a tenant's spend includes its batches.
func (s *Service) Drift(ctx context.Context, p account.DriftParams) ([]account.DriftRow, error) {
	if p.To.IsZero() {
		p.To = time.Now().Add(time.Hour)
	}
	rows, err := s.store.Pool().Query(ctx, batchDriftSQL, p.TenantID, p.Model, p.From, p.To, p.ByModel)
	if err != nil {
		return nil, fmt.Errorf("batch: drift report: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByName[account.DriftRow])
	if err != nil {
		return nil, fmt.Errorf("batch: drift report: %w", err)
	}
	for i := range out {
		out[i].Batch = true
	}
	return out, nil
}
