package replica_test

import (
	"context"
	"testing"
	"time"

	"github.com/tokengate/tokengate/budget/admission"
	"github.com/tokengate/tokengate/budget/lease"
	"github.com/tokengate/tokengate/budget/replica"
	"github.com/tokengate/tokengate/budget/rule"
)

func TestSliceFor(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name          string
		rate          float64 // tokens a second
		min, capacity int64   // tokens
		holders       int
		want          int64 // tokens
	}{
		{"quiet: the minimum", 0, 100, 100_000, 1, 100},
		{"rate x TTL/2", 1000, 100, 100_000, 1, 5000},
		{"capped at capacity / 2R", 1000, 100, 4000, 2, 1000},
		{"the cap wins over the minimum", 0, 100, 100, 1, 50},
		{"never below a token", 0, 100, 3, 4, 1},
		{"no capacity: no cap", 1000, 100, 0, 3, 5000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := replica.SliceFor(tc.rate*float64(tok), 10*time.Second, tc.min*tok, tc.capacity*tok, tc.holders)
			if got != tc.want*tok {
				t.Fatalf("slice %d micro-tokens, want %d tokens", got, tc.want)
			}
		})
	}
}

// On a frozen clock: the top-up renews a lease that fell below half its
// slice before an admission needs it (the admissions after it renew
// nothing), sizes the slice from the rate it measured, renews a lease
// within TTL/2 of its expiry, and gives back the lease of a tenant idle
// for a TTL; an admission's remaining figure is the balance outside the
// leases plus the lease's unused part.
func TestLeaseRenewsAheadOfNeed(t *testing.T) {
	t.Parallel()
	const capacity = 100_000
	b, r := leasedTenant(t, rule.Limits{TokensCapacity: capacity, TokensRateMicro: 1}, 5)
	ctx := context.Background()
	st := replica.HolderState(r.Leases, "acme")
	if st.LeaseID == "" || st.SliceMicro != minSlice*tok || st.UnusedMicro != minSlice*tok {
		t.Fatalf("after the first top-up: %+v, want a lease of the minimum slice", st)
	}
	res, _, err := r.Admitter.Reserve(ctx, req("acme", 10))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := res.Snapshot.TokensMicro, int64(capacity-15)*tok; got != want || res.AdmissionID == "" || !res.ExpiresAt.After(res.CreatedAt) {
		t.Fatalf("lease answer %+v: remaining %d, want %d", res, got, want)
	}
	for range 5 {
		if _, _, err := r.Admitter.Reserve(ctx, req("acme", 10)); err != nil {
			t.Fatal(err)
		}
	}
	_, takes := b.leases(t, "acme")
	r.Leases.TopUpOnce(ctx) // 40 left of 100: renewed to 100
	if st2 := replica.HolderState(r.Leases, "acme"); st2.LeaseID != st.LeaseID || st2.UnusedMicro != minSlice*tok {
		t.Fatalf("after the top-up: %+v, want lease %s back at %d tokens", st2, st.LeaseID, minSlice)
	}
	_, takes2 := b.leases(t, "acme")
	if takes2 != takes+1 {
		t.Fatalf("lease_take entries %d then %d: want one renew", takes, takes2)
	}
	for range 5 {
		if _, _, err := r.Admitter.Reserve(ctx, req("acme", 10)); err != nil {
			t.Fatal(err)
		}
	}
	if _, takes3 := b.leases(t, "acme"); takes3 != takes2 {
		t.Fatalf("an admission renewed the lease (%d lease_take entries, %d before)", takes3, takes2)
	}
	if got := int(paths(r, admission.PathLease)); got != 11 {
		t.Fatalf("%d lease admissions, want 11", got)
	}

	// 110 tokens in a second: the slice is 110 x TTL/2.
	b.advance(time.Second)
	r.Leases.TopUpOnce(ctx)
	st = replica.HolderState(r.Leases, "acme")
	if want := int64(110*5) * tok; st.SliceMicro != want || st.UnusedMicro != want {
		t.Fatalf("after a second at 110 tokens a second: %+v, want a slice and unused of %d", st, want)
	}

	// Near its expiry (TTL/2 left), the lease is renewed, its unused part
	// above half the (now halved) slice.
	b.advance(leaseTTL / 2)
	r.Leases.TopUpOnce(ctx)
	if st2 := replica.HolderState(r.Leases, "acme"); !st2.ExpiresAt.Equal(b.clock().Add(leaseTTL)) || st2.LeaseID != st.LeaseID {
		t.Fatalf("near its expiry: %+v, want lease %s renewed to %v", st2, st.LeaseID, b.clock().Add(leaseTTL))
	}

	// Idle for a TTL: given back; the next admission is exact.
	b.advance(leaseTTL)
	r.Leases.TopUpOnce(ctx)
	if st := replica.HolderState(r.Leases, "acme"); st.LeaseID != "" {
		t.Fatalf("idle for a TTL: %+v, want no lease", st)
	}
	if out, err := r.Leases.Store().Outstanding(ctx, "acme"); err != nil || out != 0 {
		t.Fatalf("outstanding %d, %v after the return", out, err)
	}
	exact := paths(r, admission.PathExact)
	if _, _, err := r.Admitter.Reserve(ctx, req("acme", 10)); err != nil {
		t.Fatal(err)
	}
	if got := paths(r, admission.PathExact); got != exact+1 {
		t.Fatalf("after the return, exact decisions %d, want %d", got, exact+1)
	}
}

// A busy lease's journal is booked after replica.MaxBacklog admissions
// whatever its unused part and expiry, so that each booking is bounded
// under the tenant's row locks; and it is booked without a renew, which
// would lock the lease's row (every journal group of the lease updates
// it) through a commit of its own.
func TestLeaseBooksAfterBacklog(t *testing.T) {
	t.Parallel()
	b := setupLeasesSlice(t, 1, 10_000)
	r := b.reps[0]
	ctx := context.Background()
	b.tenant(t, "acme", rule.Limits{TokensCapacity: 100_000, TokensRateMicro: 1}, lease.ModeAuto)
	b.warm(t, "acme", 1)
	reserve := func(n int) {
		t.Helper()
		for range n {
			if _, _, err := r.Admitter.Reserve(ctx, req("acme", 1)); err != nil {
				t.Fatal(err)
			}
		}
	}
	reserves := func() (n int) {
		t.Helper()
		if err := b.pool.QueryRow(ctx, "SELECT count(*) FROM ledger_entries WHERE tenant_id = 'acme' AND kind = 'reserve'").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	lease0 := replica.HolderState(r.Leases, "acme")
	booked := reserves()
	_, takes := b.leases(t, "acme")
	reserve(replica.MaxBacklog - 1)
	r.Leases.TopUpOnce(ctx)
	if got := reserves(); got != booked {
		t.Fatalf("booked before the backlog: %d reserve entries, %d before", got, booked)
	}
	reserve(1)
	r.Leases.TopUpOnce(ctx)
	if got := reserves(); got != booked+replica.MaxBacklog {
		t.Fatalf("at the backlog: %d reserve entries, want %d", got, booked+replica.MaxBacklog)
	}
	if _, got := b.leases(t, "acme"); got != takes {
		t.Fatalf("at the backlog: %d lease_take entries, want %d (booked, not renewed)", got, takes)
	}
	// Neither renewed (no later expiry) nor topped up (its unused part is
	// what it held less the backlog's costs).
	if st := replica.HolderState(r.Leases, "acme"); st.LeaseID != lease0.LeaseID || !st.ExpiresAt.Equal(lease0.ExpiresAt) ||
		st.UnusedMicro != lease0.UnusedMicro-replica.MaxBacklog*rule.Micro {
		t.Fatalf("at the backlog the lease moved: %+v, was %+v", st, lease0)
	}
	pending, err := r.Leases.Store().Book(ctx, lease0.LeaseID)
	if err != nil || pending != 0 {
		t.Fatalf("after the backlog's booking, %d more to book (%v)", pending, err)
	}
	reserve(1)
	r.Leases.TopUpOnce(ctx)
	if got := reserves(); got != booked+replica.MaxBacklog {
		t.Fatalf("one admission after the booking: %d reserve entries, want %d", got, booked+replica.MaxBacklog)
	}
	if got := paths(r, admission.PathLease); got != replica.MaxBacklog+1 {
		t.Fatalf("%d lease admissions, want %d", got, replica.MaxBacklog+1)
	}
}
