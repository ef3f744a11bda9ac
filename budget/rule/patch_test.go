package rule_test

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/tokengate/tokengate/budget/rule"
)

func TestLimitsPatchCheck(t *testing.T) {
	t.Parallel()
	const huge = 1<<58 + 60_000
	for _, tc := range []struct {
		name  string
		patch rule.LimitsPatch
		field string // "" when the patch is valid
	}{
		{"empty", rule.LimitsPatch{}, ""},
		{"huge ttl", rule.LimitsPatch{ReservationTTLMS: rule.Set[int64](huge)}, "reservation_ttl_ms"},
		{"huge wait", rule.LimitsPatch{MaxWaitMS: rule.Set[int64](huge)}, "max_wait_ms"},
		{"ttl below 1 s", rule.LimitsPatch{ReservationTTLMS: rule.Set[int64](999)}, "reservation_ttl_ms"},
		{"ttl 1 s", rule.LimitsPatch{ReservationTTLMS: rule.Set(rule.MinReservationTTL.Milliseconds())}, ""},
		{"ttl 7 d", rule.LimitsPatch{ReservationTTLMS: rule.Set(rule.MaxReservationTTL.Milliseconds())}, ""},
		{"ttl above 7 d", rule.LimitsPatch{ReservationTTLMS: rule.Set(rule.MaxReservationTTL.Milliseconds() + 1)}, "reservation_ttl_ms"},
		{"wait 0", rule.LimitsPatch{MaxWaitMS: rule.Set[int64](0)}, "max_wait_ms"},
		{"wait 1 ms", rule.LimitsPatch{MaxWaitMS: rule.Set[int64](1)}, ""},
		{"wait 10 min", rule.LimitsPatch{MaxWaitMS: rule.Set(rule.MaxMaxWait.Milliseconds())}, ""},
		{"wait above 10 min", rule.LimitsPatch{MaxWaitMS: rule.Set(rule.MaxMaxWait.Milliseconds() + 1)}, "max_wait_ms"},
		{"negative wait", rule.LimitsPatch{MaxWaitMS: rule.Set[int64](-1)}, "max_wait_ms"},
		{"max concurrent 0", rule.LimitsPatch{MaxConcurrent: rule.Set[int64](0)}, "max_concurrent"},
		{"max concurrent -5", rule.LimitsPatch{MaxConcurrent: rule.Set[int64](-5)}, "max_concurrent"},
		{"max concurrent unset", rule.LimitsPatch{MaxConcurrent: rule.Unset[int64]()}, ""},
		{"requests capacity 0", rule.LimitsPatch{RequestsCapacity: rule.Set[int64](0)}, "requests_capacity"},
		{"requests rate 0", rule.LimitsPatch{RequestsRateMicro: rule.Set[int64](0)}, "requests_per_second"},
		{"period budget 0", rule.LimitsPatch{PeriodBudget: rule.Set[int64](0)}, "period_budget"},
		{"tokens capacity unset", rule.LimitsPatch{TokensCapacity: rule.Unset[int64]()}, "tokens_capacity"},
		{"tokens rate unset", rule.LimitsPatch{TokensRateMicro: rule.Unset[int64]()}, "tokens_per_second"},
		{"tokens capacity too big", rule.LimitsPatch{TokensCapacity: rule.Set[int64](1 << 62)}, "tokens_capacity"},
		{"period week", rule.LimitsPatch{Period: rule.Set(rule.Period("week"))}, "period"},
		{"period set, budget unset", rule.LimitsPatch{Period: rule.Set(rule.PeriodDay), PeriodBudget: rule.Unset[int64]()}, "period"},
		{"policy empty", rule.LimitsPatch{OnStoreUnavailable: rule.Set(rule.Policy(""))}, "on_store_unavailable"},
		{"policy unset", rule.LimitsPatch{OnStoreUnavailable: rule.Unset[rule.Policy]()}, ""},
		{"model shadow", rule.LimitsPatch{Shadow: rule.Set(rule.LimitSet(0).With(rule.LimitInputTokens))}, "shadow"},
	} {
		err := tc.patch.Check()
		var le *rule.LimitError
		switch {
		case tc.field == "" && err != nil:
			t.Errorf("%s: %v, want valid", tc.name, err)
		case tc.field != "" && (!errors.As(err, &le) || le.Field != tc.field || !errors.Is(err, rule.ErrInvalidLimits)):
			t.Errorf("%s: %v, want a *LimitError naming %s", tc.name, err, tc.field)
		}
	}
}

func TestLimitsPatchApply(t *testing.T) {
	t.Parallel()
	base := rule.Limits{TokensCapacity: 100, TokensRateMicro: 1, RequestsCapacity: 10, RequestsRateMicro: 2, MaxConcurrent: 4,
		PeriodBudget: 1000, Period: rule.PeriodDay, ReservationTTL: time.Hour, MaxWait: time.Second,
		OnStoreUnavailable: rule.PolicyLocal, Shadow: rule.LimitSet(0).With(rule.LimitTokens)}
	if got := (rule.LimitsPatch{}).Apply(base); !reflect.DeepEqual(got, base) {
		t.Fatalf("an empty patch changed %+v into %+v", base, got)
	}
	got := rule.LimitsPatch{MaxConcurrent: rule.Set[int64](7), ReservationTTLMS: rule.Set[int64](90_000)}.Apply(base)
	want := base
	want.MaxConcurrent, want.ReservationTTL = 7, 90*time.Second
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("set: %+v, want %+v", got, want)
	}
	got = rule.LimitsPatch{
		RequestsCapacity: rule.Unset[int64](), MaxConcurrent: rule.Unset[int64](), Period: rule.Unset[rule.Period](),
		ReservationTTLMS: rule.Unset[int64](), MaxWaitMS: rule.Unset[int64](),
		OnStoreUnavailable: rule.Unset[rule.Policy](), Shadow: rule.Unset[rule.LimitSet](),
	}.Apply(base)
	want = rule.Limits{TokensCapacity: 100, TokensRateMicro: 1, ReservationTTL: rule.DefaultReservationTTL, MaxWait: rule.DefaultMaxWait}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("unset: %+v, want %+v", got, want)
	}
}
