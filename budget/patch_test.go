package budget_test

import (
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/tokengate/tokengate/budget"
)

func TestLimitsPatchCheck(t *testing.T) {
	t.Parallel()
	const huge = 1<<58 + 60_000
	for _, tc := range []struct {
		name  string
		patch budget.LimitsPatch
		field string // "" when the patch is valid
	}{
		{"empty", budget.LimitsPatch{}, ""},
		{"huge ttl", budget.LimitsPatch{ReservationTTLMS: budget.Set[int64](huge)}, "reservation_ttl_ms"},
		{"huge wait", budget.LimitsPatch{MaxWaitMS: budget.Set[int64](huge)}, "max_wait_ms"},
		{"ttl below 1 s", budget.LimitsPatch{ReservationTTLMS: budget.Set[int64](999)}, "reservation_ttl_ms"},
		{"ttl 1 s", budget.LimitsPatch{ReservationTTLMS: budget.Set(budget.MinReservationTTL.Milliseconds())}, ""},
		{"ttl 7 d", budget.LimitsPatch{ReservationTTLMS: budget.Set(budget.MaxReservationTTL.Milliseconds())}, ""},
		{"ttl above 7 d", budget.LimitsPatch{ReservationTTLMS: budget.Set(budget.MaxReservationTTL.Milliseconds() + 1)}, "reservation_ttl_ms"},
		{"wait 0", budget.LimitsPatch{MaxWaitMS: budget.Set[int64](0)}, "max_wait_ms"},
		{"wait 1 ms", budget.LimitsPatch{MaxWaitMS: budget.Set[int64](1)}, ""},
		{"wait 10 min", budget.LimitsPatch{MaxWaitMS: budget.Set(budget.MaxMaxWait.Milliseconds())}, ""},
		{"wait above 10 min", budget.LimitsPatch{MaxWaitMS: budget.Set(budget.MaxMaxWait.Milliseconds() + 1)}, "max_wait_ms"},
		{"negative wait", budget.LimitsPatch{MaxWaitMS: budget.Set[int64](-1)}, "max_wait_ms"},
		{"max concurrent 0", budget.LimitsPatch{MaxConcurrent: budget.Set[int64](0)}, "max_concurrent"},
		{"max concurrent -5", budget.LimitsPatch{MaxConcurrent: budget.Set[int64](-5)}, "max_concurrent"},
		{"max concurrent unset", budget.LimitsPatch{MaxConcurrent: budget.Unset[int64]()}, ""},
		{"requests capacity 0", budget.LimitsPatch{RequestsCapacity: budget.Set[int64](0)}, "requests_capacity"},
		{"requests rate 0", budget.LimitsPatch{RequestsRateMicro: budget.Set[int64](0)}, "requests_per_second"},
		{"period budget 0", budget.LimitsPatch{PeriodBudget: budget.Set[int64](0)}, "period_budget"},
		{"tokens capacity unset", budget.LimitsPatch{TokensCapacity: budget.Unset[int64]()}, "tokens_capacity"},
		{"tokens rate unset", budget.LimitsPatch{TokensRateMicro: budget.Unset[int64]()}, "tokens_per_second"},
		{"tokens capacity too big", budget.LimitsPatch{TokensCapacity: budget.Set[int64](1 << 62)}, "tokens_capacity"},
		{"period week", budget.LimitsPatch{Period: budget.Set(budget.Period("week"))}, "period"},
		{"period set, budget unset", budget.LimitsPatch{Period: budget.Set(budget.PeriodDay), PeriodBudget: budget.Unset[int64]()}, "period"},
		{"policy empty", budget.LimitsPatch{OnStoreUnavailable: budget.Set(budget.Policy(""))}, "on_store_unavailable"},
		{"policy unset", budget.LimitsPatch{OnStoreUnavailable: budget.Unset[budget.Policy]()}, ""},
		{"model shadow", budget.LimitsPatch{Shadow: budget.Set(budget.LimitSet(0).With(budget.LimitInputTokens))}, "shadow"},
	} {
		err := tc.patch.Check()
		var le *budget.LimitError
		switch {
		case tc.field == "" && err != nil:
			t.Errorf("%s: %v, want valid", tc.name, err)
		case tc.field != "" && (!errors.As(err, &le) || le.Field != tc.field || !errors.Is(err, budget.ErrInvalidLimits)):
			t.Errorf("%s: %v, want a *LimitError naming %s", tc.name, err, tc.field)
		}
	}
}

func TestLimitsPatchApply(t *testing.T) {
	t.Parallel()
	base := budget.Limits{TokensCapacity: 100, TokensRateMicro: 1, RequestsCapacity: 10, RequestsRateMicro: 2, MaxConcurrent: 4,
		PeriodBudget: 1000, Period: budget.PeriodDay, ReservationTTL: time.Hour, MaxWait: time.Second,
		OnStoreUnavailable: budget.PolicyLocal, Shadow: budget.LimitSet(0).With(budget.LimitTokens)}
	if got := (budget.LimitsPatch{}).Apply(base); !reflect.DeepEqual(got, base) {
		t.Fatalf("an empty patch changed %+v into %+v", base, got)
	}
	got := budget.LimitsPatch{MaxConcurrent: budget.Set[int64](7), ReservationTTLMS: budget.Set[int64](90_000)}.Apply(base)
	want := base
	want.MaxConcurrent, want.ReservationTTL = 7, 90*time.Second
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("set: %+v, want %+v", got, want)
	}
	got = budget.LimitsPatch{
		RequestsCapacity: budget.Unset[int64](), MaxConcurrent: budget.Unset[int64](), Period: budget.Unset[budget.Period](),
		ReservationTTLMS: budget.Unset[int64](), MaxWaitMS: budget.Unset[int64](),
		OnStoreUnavailable: budget.Unset[budget.Policy](), Shadow: budget.Unset[budget.LimitSet](),
	}.Apply(base)
	want = budget.Limits{TokensCapacity: 100, TokensRateMicro: 1, ReservationTTL: budget.DefaultReservationTTL, MaxWait: budget.DefaultMaxWait}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("unset: %+v, want %+v", got, want)
	}
}

// TestUpdateLimitsPatchesConcurrently: goroutines on many connections patch
// one field each of one tenant; every field ends with its value and the
// ledger holds one limits entry per patch. A refused patch changes nothing.
func TestUpdateLimitsPatchesConcurrently(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.tenant(t, "acme", limits(100, "1"))
	const rounds = 20
	for r := range rounds {
		patches := []budget.LimitsPatch{
			{TokensCapacity: budget.Set(int64(1000 + r))},
			{MaxConcurrent: budget.Set(int64(1 + r))},
			{PeriodBudget: budget.Set(int64(5000 + r)), Period: budget.Set(budget.PeriodMonth)},
			{RequestsCapacity: budget.Set(int64(50 + r)), RequestsRateMicro: budget.Set(int64(1_000_000 + r))},
			{MaxWaitMS: budget.Set(int64(100 + r))},
			{ReservationTTLMS: budget.Set(int64(1<<58 + 60_000))}, // refused
		}
		errs := make([]error, len(patches))
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i, p := range patches {
			wg.Go(func() {
				<-start
				_, errs[i] = b.store.UpdateLimits(ctx, budget.UpdateLimitsParams{TenantID: "acme", Patch: p, Actor: fmt.Sprint("admin", i)})
			})
		}
		close(start)
		wg.Wait()
		for i, err := range errs[:len(errs)-1] {
			if err != nil {
				t.Fatalf("round %d patch %d: %v", r, i, err)
			}
		}
		if !errors.Is(errs[len(errs)-1], budget.ErrInvalidLimits) {
			t.Fatalf("round %d: the huge ttl: %v", r, errs[len(errs)-1])
		}
		s, err := b.store.TenantSnapshot(ctx, "acme")
		if err != nil {
			t.Fatal(err)
		}
		want := budget.Limits{TokensCapacity: int64(1000 + r), TokensRateMicro: 1_000_000, MaxConcurrent: int64(1 + r),
			PeriodBudget: int64(5000 + r), Period: budget.PeriodMonth, RequestsCapacity: int64(50 + r), RequestsRateMicro: int64(1_000_000 + r),
			MaxWait: time.Duration(100+r) * time.Millisecond, ReservationTTL: budget.DefaultReservationTTL}
		if err := want.Validate(); err != nil { // the period budget is the window "period"
			t.Fatal(err)
		}
		if !reflect.DeepEqual(s.Limits, want) {
			t.Fatalf("round %d: %+v, want %+v", r, s.Limits, want)
		}
	}
	var n int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM ledger_entries WHERE tenant_id = 'acme' AND kind = 'limits'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 5*rounds {
		t.Fatalf("%d limits entries, want %d", n, 5*rounds)
	}
}
