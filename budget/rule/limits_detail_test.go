package rule_test

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/tokengate/tokengate/budget/rule"
)

// TestLimitsDetailReadsBack: limits are stored in their one JSON shape
// (Limits.Detail: a ledger entry's limits, an end-user template) and read
// back by LimitsDetail.Limits; every field must survive the trip, or an end
// user would be created with other limits than its tenant's template says.
// A field added to Limits and to LimitsDetail must be added to
// LimitsDetail.Limits too: this test then fails until it is.
func TestLimitsDetailReadsBack(t *testing.T) {
	t.Parallel()
	for _, l := range []rule.Limits{
		{TokensCapacity: 1, TokensRateMicro: 1, ReservationTTL: time.Second, MaxWait: 0},
		{TokensCapacity: 20000, TokensRateMicro: 2_500_000, RequestsCapacity: 60, RequestsRateMicro: 1_000_001,
			MaxConcurrent: 4, PeriodBudget: 1_000_000, Period: rule.PeriodMonth, ReservationTTL: 90 * time.Second,
			MaxWait: 5 * time.Second, OnStoreUnavailable: rule.PolicyLocal,
			Shadow: rule.LimitSet(0).With(rule.LimitRequests).With(rule.LimitConcurrency)},
	} {
		raw, err := json.Marshal(l.Detail())
		if err != nil {
			t.Fatal(err)
		}
		if string(raw) != string(rule.LimitsJSON(l)) {
			t.Fatalf("LimitsJSON %s, want %s", rule.LimitsJSON(l), raw)
		}
		var d rule.LimitsDetail
		if err := json.Unmarshal(raw, &d); err != nil {
			t.Fatal(err)
		}
		got, err := d.Limits()
		if err != nil || !reflect.DeepEqual(got, l) || !rule.SameLimits(got, l) {
			t.Fatalf("%s read back as %+v (%v), want %+v", raw, got, err, l)
		}
	}
	if rule.SameLimits(rule.Limits{TokensCapacity: 1}, rule.Limits{TokensCapacity: 2}) {
		t.Fatal("different limits are the same")
	}
}
