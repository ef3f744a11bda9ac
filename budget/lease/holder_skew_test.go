package lease_test

import (
	"context"
	"testing"
	"time"

	"github.com/tokengate/tokengate/budget/lease"
	"github.com/tokengate/tokengate/budget/rule"
)

// A holder whose clock is off the store's by a fixed skew (the soak's
// TOKENGATE_CLOCK_OFFSET: minutes) keeps its lease's expiry by its own
// clock, a TTL from its reading before the take or renew, and never
// compares its clock with the store's expires_at. Ahead, it would
// otherwise think every lease past its expiry (no admission from any lease,
// a renew at every top-up); behind, it would think a lease live long after
// the store expired it (no renew ahead of the expiry, every admission
// refused by the journal once it passed).
func TestHolderClockSkewed(t *testing.T) {
	t.Parallel()
	const ttl = 10 * time.Second // setup's
	for _, skew := range []time.Duration{10 * time.Minute, -10 * time.Minute} {
		t.Run(skew.String(), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := context.Background()
			b.tenant(t, "acme", "", rule.Limits{TokensCapacity: 10_000, TokensRateMicro: tok})
			h := lease.NewHolder(b.r.leases, b.r.journal, lease.HolderConfig{TenantID: "acme", SliceMicro: 100 * tok,
				NowFunc: func() time.Time { return b.clock().Add(skew) }})
			if changed, err := h.TopUp(ctx, 0, ttl/2); err != nil || !changed {
				t.Fatalf("first top-up: %t, %v; want a take", changed, err)
			}
			first := h.LeaseID()
			if err := h.AdmitHeld(ctx, adm("a", 10), nil); err != nil {
				t.Fatalf("admit from a lease just taken: %v", err)
			}
			// Nothing due: the lease is fresh and holds 90 of 100.
			if changed, err := h.TopUp(ctx, 50*tok, ttl/2); err != nil || changed {
				t.Fatalf("top-up of a fresh lease: %t, %v; want nothing done", changed, err)
			}
			// Past half the TTL by both clocks: the top-up renews it.
			b.advance(ttl/2 + time.Second)
			if changed, err := h.TopUp(ctx, 50*tok, ttl/2); err != nil || !changed {
				t.Fatalf("top-up within half a TTL of the expiry: %t, %v; want a renew", changed, err)
			}
			var expires time.Time
			if err := b.r.pool.QueryRow(ctx, "SELECT expires_at FROM leases WHERE id = $1", first).Scan(&expires); err != nil {
				t.Fatal(err)
			}
			if want := b.clock().Add(ttl); !expires.Equal(want) {
				t.Fatalf("the lease expires at %s by the store; want %s (renewed now)", expires, want)
			}
			if st := h.State(); !st.ExpiresAt.Equal(b.clock().Add(skew + ttl)) {
				t.Fatalf("the holder has the expiry at %s by its clock; want %s", st.ExpiresAt, b.clock().Add(skew+ttl))
			}
			// Past the first expiry, within the renewed one: still admitted
			// from the same lease.
			b.advance(ttl/2 + time.Second)
			if err := h.AdmitHeld(ctx, adm("b", 10), nil); err != nil {
				t.Fatalf("admit after the renew, past the take's expiry: %v", err)
			}
			if h.LeaseID() != first {
				t.Fatalf("lease %q; want the renewed %q", h.LeaseID(), first)
			}
			// Within RenewBefore (a third of the TTL) of the renewed expiry
			// by the holder's clock: it admits nothing more until a renew.
			b.advance(ttl - ttl/2 - time.Second - ttl/3 + time.Second)
			if err := h.AdmitHeld(ctx, adm("c", 10), nil); err != lease.ErrExhausted {
				t.Fatalf("admit within RenewBefore of the expiry: %v; want ErrExhausted", err)
			}
			if err := h.Return(ctx); err != nil {
				t.Fatal(err)
			}
			if n, _, est := b.kindSum(t, "acme", "reserve"); n != 2 || est != 20 {
				t.Fatalf("%d reserve entries for %d; want a and b, 20", n, est)
			}
			b.verify(t, "acme")
		})
	}
}
