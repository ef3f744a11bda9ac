package account

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/tokengate/tokengate/budget/rule"
)

// TestLimitsOfReadsBackDetailOf: a template is stored in the shape of a
// ledger entry's limits (detailOf) and read back by limitsOf; every field
// must survive the trip, or an end user would be created with other limits
// than its tenant's template says. A field added to Limits and to
// limitsDetail must be added to limitsOf too: this test then fails until
// it is.
func TestLimitsOfReadsBackDetailOf(t *testing.T) {
	t.Parallel()
	for _, l := range []rule.Limits{
		{TokensCapacity: 1, TokensRateMicro: 1, ReservationTTL: time.Second, MaxWait: 0},
		{TokensCapacity: 20000, TokensRateMicro: 2_500_000, RequestsCapacity: 60, RequestsRateMicro: 1_000_001,
			MaxConcurrent: 4, PeriodBudget: 1_000_000, Period: rule.PeriodMonth, ReservationTTL: 90 * time.Second,
			MaxWait: 5 * time.Second, OnStoreUnavailable: rule.PolicyLocal,
			Shadow: rule.LimitSet(0).With(rule.LimitRequests).With(rule.LimitConcurrency)},
	} {
		raw, err := json.Marshal(detailOf(l))
		if err != nil {
			t.Fatal(err)
		}
		var d limitsDetail
		if err := json.Unmarshal(raw, &d); err != nil {
			t.Fatal(err)
		}
		got, err := limitsOf(d)
		if err != nil || !reflect.DeepEqual(got, l) || !sameLimits(got, l) {
			t.Fatalf("%s read back as %+v (%v), want %+v", raw, got, err, l)
		}
	}
}
