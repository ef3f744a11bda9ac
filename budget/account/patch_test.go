package account_test

import (
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
)

// TestUpdateLimitsPatchesConcurrently: goroutines on many connections patch
// one field each of one tenant; every field ends with its value and the
// ledger holds one limits entry per patch. A refused patch changes nothing.
func TestUpdateLimitsPatchesConcurrently(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.tenant(t, "acme", limits(100, "1"))
	const rounds = 20
	for r := range rounds {
		patches := []rule.LimitsPatch{
			{TokensCapacity: rule.Set(int64(1000 + r))},
			{MaxConcurrent: rule.Set(int64(1 + r))},
			{PeriodBudget: rule.Set(int64(5000 + r)), Period: rule.Set(rule.PeriodMonth)},
			{RequestsCapacity: rule.Set(int64(50 + r)), RequestsRateMicro: rule.Set(int64(1_000_000 + r))},
			{MaxWaitMS: rule.Set(int64(100 + r))},
			{ReservationTTLMS: rule.Set(int64(1<<58 + 60_000))}, // refused
		}
		errs := make([]error, len(patches))
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i, p := range patches {
			wg.Go(func() {
				<-start
				_, errs[i] = b.store.UpdateLimits(ctx, account.UpdateLimitsParams{TenantID: "acme", Patch: p, Actor: fmt.Sprint("admin", i)})
			})
		}
		close(start)
		wg.Wait()
		for i, err := range errs[:len(errs)-1] {
			if err != nil {
				t.Fatalf("round %d patch %d: %v", r, i, err)
			}
		}
		if !errors.Is(errs[len(errs)-1], rule.ErrInvalidLimits) {
			t.Fatalf("round %d: the huge ttl: %v", r, errs[len(errs)-1])
		}
		s, err := b.store.TenantSnapshot(ctx, "acme")
		if err != nil {
			t.Fatal(err)
		}
		want := rule.Limits{TokensCapacity: int64(1000 + r), TokensRateMicro: 1_000_000, MaxConcurrent: int64(1 + r),
			PeriodBudget: int64(5000 + r), Period: rule.PeriodMonth, RequestsCapacity: int64(50 + r), RequestsRateMicro: int64(1_000_000 + r),
			MaxWait: time.Duration(100+r) * time.Millisecond, ReservationTTL: rule.DefaultReservationTTL}
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
