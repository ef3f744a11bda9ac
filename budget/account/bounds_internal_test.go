package account

import (
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

// TestSettleBounds: the glue reads the window from the model table (the
// widest a model may serve), holds a model the table does not know to
// rule.MaxUnknownModelUsage, and takes a nil table as the seeded one; the
// rule's arithmetic is tested in budget/rule.
func TestSettleBounds(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		e    estimator.Estimate
		want rule.UsageBound
	}{
		{estimator.Estimate{Model: "gpt-4o-2024-08-06", InputTokens: 100, OutputTokens: 50}, rule.UsageBound{MaxOutput: 50, MaxTotal: 128_000}},
		{estimator.Estimate{Model: "gpt-4o", InputTokens: 200_000, OutputTokens: 40_000}, rule.UsageBound{MaxOutput: 40_000, MaxTotal: 240_000}},
		{estimator.Estimate{Model: "no-such-model", InputTokens: 10, OutputTokens: 10}, rule.UsageBound{MaxOutput: 10, MaxTotal: rule.MaxUnknownModelUsage}},
	} {
		if got := SettleBounds(tt.e, nil); got != tt.want {
			t.Errorf("%s: %+v, want %+v", tt.e.Model, got, tt.want)
		}
		if got := SettleBounds(tt.e, estimator.DefaultTable()); got != tt.want {
			t.Errorf("%s with the seeded table: %+v, want %+v", tt.e.Model, got, tt.want)
		}
	}
}

// Postgres' bigint arithmetic fails past int64 (SQLSTATE 22003) instead
// of wrapping: the store reports it as ErrOverflow, never as an outage.
func TestClassifyOutOfRange(t *testing.T) {
	t.Parallel()
	err := classify(&pgconn.PgError{Code: "22003", Message: "bigint out of range"}, false, false)
	var oe *rule.OverflowError
	if !errors.As(err, &oe) || errors.Is(err, rule.ErrUnavailable) {
		t.Fatalf("22003: %v", err)
	}
}
