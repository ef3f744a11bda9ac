package replica_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/admission"
	"github.com/tokengate/tokengate/budget/lease"
	"github.com/tokengate/tokengate/budget/rule"
)

// keyedReq is a request of tenant with an Idempotency-Key and a body.
func keyedReq(tenant, key, body string, cost int64) admission.Request {
	q := req(tenant, cost)
	q.IdempotencyKey, q.Body = key, []byte(body)
	return q
}

// admitted counts the tenant's admissions rows and reserve entries named by
// id: what was admitted and debited for it, once its lease is booked.
func (b *leaseBundle) admitted(t *testing.T, tenant, id string) (rows, reserves int) {
	t.Helper()
	ctx := context.Background()
	if err := b.pool.QueryRow(ctx, "SELECT count(*) FROM admissions WHERE tenant_id = $1 AND id = $2", tenant, id).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if err := b.pool.QueryRow(ctx, "SELECT count(*) FROM ledger_entries WHERE tenant_id = $1 AND kind = 'reserve' AND admission_id = $2", tenant, id).Scan(&reserves); err != nil {
		t.Fatal(err)
	}
	return rows, reserves
}

// sameAnswer fails unless got is want replayed: the same id and fields.
func sameAnswer(t *testing.T, what string, got, want *account.Reservation) {
	t.Helper()
	w := *want
	w.Replayed = true
	if !got.Replayed || got.AdmissionID != w.AdmissionID || !got.CreatedAt.Equal(w.CreatedAt) || !got.ExpiresAt.Equal(w.ExpiresAt) ||
		got.Estimate != w.Estimate || got.Snapshot.TokensMicro != w.Snapshot.TokensMicro || got.Snapshot.Limits.TokensCapacity != w.Snapshot.Limits.TokensCapacity ||
		!got.Snapshot.At.Equal(w.Snapshot.At) {
		t.Fatalf("%s: %+v, want the replay of %+v", what, got, w)
	}
}

// A keyed request admitted from a lease keeps its answer: a retry through
// the lease and, once the mode is off, through the exact path replays it
// (the same id and fields, one admission and one reserve entry); the key
// with another body is a mismatch on both paths. A key kept with
// ReplayNow (the rate limit service's) is replayed by the exact path.
func TestLeaseKeyedReplays(t *testing.T) {
	t.Parallel()
	b, r := leasedTenant(t, rule.Limits{TokensCapacity: 10_000, TokensRateMicro: 1}, 5)
	ctx := context.Background()
	first := leaseReserve(t, r, keyedReq("acme", "k1", "body", 7), 1)
	again, _, err := r.Admitter.Reserve(ctx, keyedReq("acme", "k1", "body", 7))
	if err != nil {
		t.Fatal(err)
	}
	sameAnswer(t, "retry through the lease", again, first)
	if got := paths(r, admission.PathLease); got != 2 {
		t.Fatalf("%d lease decisions, want the replay answered from the lease path", got)
	}
	if _, _, err := r.Admitter.Reserve(ctx, keyedReq("acme", "k1", "other", 7)); !errors.Is(err, rule.ErrIdempotencyMismatch) {
		t.Fatalf("another body through the lease: %v, want ErrIdempotencyMismatch", err)
	}

	// ReplayNow: no answer kept; the retry is replayed by the exact path.
	now := keyedReq("acme", "rls:1", "descriptor", 3)
	now.ReplayNow = true
	rn, _, err := r.Admitter.Reserve(ctx, now)
	if err != nil {
		t.Fatal(err)
	}
	lease0, exact0 := paths(r, admission.PathLease), paths(r, admission.PathExact)
	rn2, _, err := r.Admitter.Reserve(ctx, now)
	if err != nil {
		t.Fatal(err)
	}
	if !rn2.Replayed || rn2.AdmissionID != rn.AdmissionID || paths(r, admission.PathExact) != exact0+1 || paths(r, admission.PathLease) != lease0 {
		t.Fatalf("ReplayNow retry %+v of %s: want the exact path's replay", rn2, rn.AdmissionID)
	}

	// Mode off ends (and books) the lease: the exact path replays the kept
	// answer.
	if _, err := r.Admin.TenantLeaseModeSet(ctx, lease.SetModeParams{TenantID: "acme", Mode: lease.ModeOff}); err != nil {
		t.Fatal(err)
	}
	exact, _, err := r.Admitter.Reserve(ctx, keyedReq("acme", "k1", "body", 7))
	if err != nil {
		t.Fatal(err)
	}
	sameAnswer(t, "retry through the exact path", exact, first)
	if _, _, err := r.Admitter.Reserve(ctx, keyedReq("acme", "k1", "other", 7)); !errors.Is(err, rule.ErrIdempotencyMismatch) {
		t.Fatalf("another body through the exact path: %v, want ErrIdempotencyMismatch", err)
	}
	for _, id := range []string{first.AdmissionID, rn.AdmissionID} {
		// The journal named it (its group and place): the answer, the
		// kept bytes both paths replayed, and the row all hold that id.
		if _, ok := rule.AdmissionGroupOf(id); !ok {
			t.Fatalf("%s: a leased admission's id names no journal group", id)
		}
		if rows, reserves := b.admitted(t, "acme", id); rows != 1 || reserves != 1 {
			t.Fatalf("%s: %d admissions rows and %d reserve entries, want one of each", id, rows, reserves)
		}
	}
}

// Twenty keys retried by eight goroutines on two replicas, from their
// leases (and the exact path when a lease cannot pay): each key is
// admitted exactly once, every answer of a key names that admission, one
// admissions row and one reserve entry each.
func TestLeaseKeysConcurrentReplicas(t *testing.T) {
	t.Parallel()
	b := setupLeases(t, 2)
	ctx := context.Background()
	b.tenant(t, "acme", rule.Limits{TokensCapacity: 100_000, TokensRateMicro: 1}, lease.ModeAuto)
	b.warm(t, "acme", 5)
	const keys, workers, rounds = 20, 8, 3
	var mu sync.Mutex
	ids := map[string]map[string]bool{}
	fresh := map[string]int{}
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := b.reps[w%2]
			for i := range keys * rounds {
				k := fmt.Sprintf("key-%02d", (i+w*3)%keys)
				res, _, err := r.Admitter.Reserve(ctx, keyedReq("acme", k, "body", 4))
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				if ids[k] == nil {
					ids[k] = map[string]bool{}
				}
				ids[k][res.AdmissionID] = true
				if !res.Replayed {
					fresh[k]++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	leased := paths(b.reps[0], admission.PathLease) + paths(b.reps[1], admission.PathLease)
	if leased == 0 {
		t.Fatal("nothing decided from a lease")
	}
	// Mode off books every journaled admission.
	if _, err := b.reps[0].Admin.TenantLeaseModeSet(ctx, lease.SetModeParams{TenantID: "acme", Mode: lease.ModeOff}); err != nil {
		t.Fatal(err)
	}
	for i := range keys {
		k := fmt.Sprintf("key-%02d", i)
		if len(ids[k]) != 1 || fresh[k] != 1 {
			t.Fatalf("%s: ids %v, %d first answers: want one admission", k, ids[k], fresh[k])
		}
		for id := range ids[k] {
			if rows, reserves := b.admitted(t, "acme", id); rows != 1 || reserves != 1 {
				t.Fatalf("%s (%s): %d admissions rows and %d reserve entries, want one of each", k, id, rows, reserves)
			}
		}
	}
	var n int
	if err := b.pool.QueryRow(ctx, "SELECT count(*) FROM admissions WHERE tenant_id = 'acme'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != keys+2 { // the keys' and the two warm-ups'
		t.Fatalf("%d admissions rows, want %d", n, keys+2)
	}
}

// A request through a gateway credential is leased, and once the gateway
// is revoked its requests are refused (by the journal, then by the exact
// decision they fall back to) with rule.ErrGatewayRevoked, as exact mode
// refuses them; a gateway scoped to other tenants gets rule.ErrOutOfScope.
func TestLeaseRevokedGateway(t *testing.T) {
	t.Parallel()
	b := setupLeases(t, 1)
	r := b.reps[0]
	ctx := context.Background()
	b.tenant(t, "acme", rule.Limits{TokensCapacity: 10_000, TokensRateMicro: tok}, lease.ModeAuto)
	gw, _, err := r.Admin.GatewayCreate(ctx, "envoy", []string{"acme"})
	if err != nil {
		t.Fatal(err)
	}
	other, _, err := r.Admin.GatewayCreate(ctx, "elsewhere", []string{"beta"})
	if err != nil {
		t.Fatal(err)
	}
	through := func(g string) admission.Request {
		q := req("acme", 5)
		q.GatewayID = g
		return q
	}
	b.warm(t, "acme", 5)
	if _, _, err := r.Admitter.Reserve(ctx, through(gw.ID)); err != nil {
		t.Fatal(err)
	}
	if got := paths(r, admission.PathLease); got != 1 {
		t.Fatalf("%d lease admissions, want the gateway's request leased", got)
	}
	if _, _, err := r.Admitter.Reserve(ctx, through(other.ID)); !errors.Is(err, rule.ErrOutOfScope) {
		t.Fatalf("a gateway of other tenants: %v, want ErrOutOfScope", err)
	}
	if err := r.Admin.GatewayRevoke(ctx, gw.ID); err != nil {
		t.Fatal(err)
	}
	if _, _, err := r.Admitter.Reserve(ctx, through(gw.ID)); !errors.Is(err, rule.ErrGatewayRevoked) {
		t.Fatalf("a revoked gateway's request: %v, want ErrGatewayRevoked", err)
	}
	if got := paths(r, admission.PathLease); got != 1 {
		t.Fatalf("%d lease admissions, want only the first", got)
	}
}

// A leased admission's row expires at its journal time plus the tenant's
// reservation TTL as its lease's snapshot holds it: the TTL its answer's
// expiry is computed from, given by the replica, not read per row.
func TestLeaseAdmissionExpiryFromSnapshot(t *testing.T) {
	t.Parallel()
	b, r := leasedTenant(t, rule.Limits{TokensCapacity: 10_000, TokensRateMicro: 1, ReservationTTL: 90 * time.Second}, 5)
	ctx := context.Background()
	check := func(nth int) {
		t.Helper()
		res := leaseReserve(t, r, req("acme", 7), nth)
		var created, expires time.Time
		if err := b.pool.QueryRow(ctx, "SELECT created_at, expires_at FROM admissions WHERE id = $1", res.AdmissionID).Scan(&created, &expires); err != nil {
			t.Fatal(err)
		}
		if got := expires.Sub(created); got != 90*time.Second {
			t.Fatalf("admission %d: the row expires %s after its journal time, want the snapshot's 90s", nth, got)
		}
		if got := res.ExpiresAt.Sub(res.CreatedAt); got != 90*time.Second {
			t.Fatalf("admission %d: the answer expires %s after it, want 90s", nth, got)
		}
	}
	check(1)
	// The tenant's row changed behind the replica's back: until its lease's
	// next take or renew reads it, row and answer keep the snapshot's TTL.
	if _, err := b.pool.Exec(ctx, "UPDATE tenants SET reservation_ttl_ms = 30000 WHERE id = 'acme'"); err != nil {
		t.Fatal(err)
	}
	check(2)
}
