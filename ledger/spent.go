package ledger

import (
	"context"
	_ "embed"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

//go:embed sql/money_spent.sql
var moneySpentSQL string

// SpanParams names a tenant's span of time: its entries created at or after
// Since.
type SpanParams struct {
	TenantID string
	Since    time.Time
}

// MoneySpent returns, for each span, the money the tenant's entries moved
// in it, in micro-units of the deployment's currency, counted as a window
// counts: the MoneyMicro of every entry of an admission reserved in the
// span (reserve +estimate, settle actual-estimate, release -estimate), so
// settled admissions count what they cost and open ones what they
// reserved; of an admission reserved before the span, only a settle's
// extra charge (its refund went to the span that bore its estimate). So a
// money window's Used equals its span's MoneySpent.
//
// Why the ledger and not the tenant row: a window that counts tokens keeps
// no money, and the ledger has every entry's money exactly (each level of a
// tree records its descendants' admissions in its own chain, so a parent's
// sum is its tree's spend). One round trip answers every span of a page.
func MoneySpent(ctx context.Context, q Querier, spans []SpanParams) ([]int64, error) {
	if len(spans) == 0 {
		return nil, nil
	}
	ids, since := make([]string, len(spans)), make([]time.Time, len(spans))
	for i, s := range spans {
		ids[i], since[i] = s.TenantID, s.Since
	}
	rows, err := q.Query(ctx, moneySpentSQL, ids, since)
	if err != nil {
		return nil, fmt.Errorf("ledger: money spent: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("ledger: money spent: %w", err)
	}
	return out, nil
}
