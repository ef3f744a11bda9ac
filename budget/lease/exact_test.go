package lease_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/lease"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/integration/await"
)

// holdKeyLock holds the advisory lock a decision takes for (tenant, key)
// (idempotency_key_lock.sql) in a transaction of its own, until the
// returned function is called.
func holdKeyLock(t *testing.T, b *testBundle, tenantID, key string) (release func()) {
	t.Helper()
	ctx := context.Background()
	tx, err := b.r.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtextextended($1 || ' ' || $2, 0))", tenantID, key); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release = func() { once.Do(func() { _ = tx.Rollback(ctx) }) }
	t.Cleanup(release)
	return release
}

// waitKeyLockWaiter waits (up to 10 s) until a session waits for an
// advisory lock.
func waitKeyLockWaiter(t *testing.T, b *testBundle) {
	t.Helper()
	var n int
	await.Until(t, 10*time.Second, "a decision waiting for the key's advisory lock", func() bool {
		if err := b.r.pool.QueryRow(context.Background(),
			"SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	}, func() string { return "no advisory lock waiter" })
}

// unbookedSQL counts the admissions made from leases whose ledger entries
// are still to write: above their lease's booking cursor.
const unbookedSQL = `SELECT count(*) FROM admissions a
	WHERE a.lease_id IS NOT NULL
	  AND a.lease_seq > coalesce((SELECT booked_seq FROM admission_lease_books b WHERE b.lease_id = a.lease_id), 0)`

// Exact mode takes the keys' advisory locks only for a tenant with a live
// lease (docs/leasing.md, "Exact mode's added reads"), and reads no journal:
// a leased admission's admissions and key rows are written by its group
// commit. Without a live lease, a keyed reserve does not wait for its key's
// lock held elsewhere, and replays a key a returned lease journaled. With
// one, a keyed reserve waits for the key's lock, replays a key journaled
// and not booked yet, and a settle of an admission not booked yet books
// its lease first: its reserve entry comes before the settle's.
func TestExactWithLeasedAdmissions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.tenant(t, "acme", "", rule.Limits{TokensCapacity: 10000, TokensRateMicro: tok})
	b.tenant(t, "other", "", rule.Limits{TokensCapacity: 10000, TokensRateMicro: tok})
	// other's live lease: a leased tenant in the database is no reason to
	// take acme's key locks.
	if _, err := b.r.leases.Take(ctx, lease.TakeParams{TenantID: "other", WantMicro: 100 * tok}); err != nil {
		t.Fatal(err)
	}
	keyed := func(key string) account.ReserveParams {
		return account.ReserveParams{TenantID: "acme", Estimate: estimate(10), IdempotencyKey: key, RequestHash: []byte(key), ReplayNow: true}
	}

	// A lease of acme journals a keyed admission and is returned: booked.
	l, err := b.r.leases.Take(ctx, lease.TakeParams{TenantID: "acme", WantMicro: 100 * tok})
	if err != nil {
		t.Fatal(err)
	}
	first := rule.NewStoreAdmissionID(b.clock())
	if err := b.r.journal.Append(ctx, l.ID, admissionOf(first, keyed("k0"))); err != nil {
		t.Fatal(err)
	}
	if _, err := b.r.leases.Return(ctx, l.ID); err != nil {
		t.Fatal(err)
	}

	// No live lease: the key's lock held elsewhere does not stop the
	// reserve.
	release := holdKeyLock(t, b, "acme", "k1")
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	r, err := b.r.acct.Reserve(rctx, keyed("k1"))
	cancel()
	if err != nil {
		t.Fatalf("a keyed reserve without a live lease: %v (did it wait for the key's advisory lock?)", err)
	}
	release()
	if r, err := b.r.acct.Reserve(ctx, keyed("k0")); err != nil || !r.Replayed || r.AdmissionID != first {
		t.Fatalf("the returned lease's key: %+v, %v; want a replay of %s", r, err, first)
	}
	if s, err := b.r.acct.Settle(ctx, account.SettleParams{TenantID: "acme", AdmissionID: first, InputTokens: 2, OutputTokens: 3}); err != nil || s.Admission.ID != first {
		t.Fatalf("settle the booked lease admission: %+v, %v", s, err)
	}
	if _, err := b.r.acct.Settle(ctx, account.SettleParams{TenantID: "acme", AdmissionID: r.AdmissionID, InputTokens: 2, OutputTokens: 3}); err != nil {
		t.Fatal(err)
	}

	// A live lease: a key journaled and not booked is a replay, the settle
	// books it first, and a keyed reserve waits for its key's lock.
	l, err = b.r.leases.Take(ctx, lease.TakeParams{TenantID: "acme", WantMicro: 100 * tok})
	if err != nil {
		t.Fatal(err)
	}
	journaled := rule.NewStoreAdmissionID(b.clock())
	if err := b.r.journal.Append(ctx, l.ID, admissionOf(journaled, keyed("k2"))); err != nil {
		t.Fatal(err)
	}
	var unbooked int
	if err := b.r.pool.QueryRow(ctx, unbookedSQL).Scan(&unbooked); err != nil || unbooked != 1 {
		t.Fatalf("%d admissions not booked (%v); want the one journaled", unbooked, err)
	}
	if r, err := b.r.acct.Reserve(ctx, keyed("k2")); err != nil || !r.Replayed || r.AdmissionID != journaled {
		t.Fatalf("a key journaled, not booked: %+v, %v; want a replay of %s", r, err, journaled)
	}
	s, err := b.r.acct.Settle(ctx, account.SettleParams{TenantID: "acme", AdmissionID: journaled, InputTokens: 2, OutputTokens: 3})
	if err != nil || s.Admission.ID != journaled || s.Admission.State != account.StateSettled {
		t.Fatalf("settle an admission not booked: %+v, %v", s, err)
	}
	if err := b.r.pool.QueryRow(ctx, unbookedSQL).Scan(&unbooked); err != nil || unbooked != 0 {
		t.Fatalf("%d admissions not booked (%v); want the settled one booked", unbooked, err)
	}
	var kinds []string
	if err := b.r.pool.QueryRow(ctx, "SELECT array_agg(kind::text ORDER BY seq) FROM ledger_entries WHERE tenant_id = 'acme' AND admission_id = $1", journaled).Scan(&kinds); err != nil {
		t.Fatal(err)
	}
	if len(kinds) != 2 || kinds[0] != "reserve" || kinds[1] != "settle" {
		t.Fatalf("the settled admission's entries: %v; want reserve then settle", kinds)
	}
	release = holdKeyLock(t, b, "acme", "k3")
	done := make(chan error, 1)
	go func() {
		_, err := b.r.acct.Reserve(ctx, keyed("k3"))
		done <- err
	}()
	waitKeyLockWaiter(t, b)
	select {
	case err := <-done:
		t.Fatalf("a keyed reserve with a live lease did not wait for its key's lock: %v", err)
	default:
	}
	release()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the keyed reserve did not end after the key's lock was released")
	}
	if _, err := b.r.leases.Return(ctx, l.ID); err != nil {
		t.Fatal(err)
	}
	b.verify(t, "acme")
}

// Exact keyed reserves of one tenant, from many goroutines on two
// replicas, while its lease mode flips and leases are taken, journal
// admissions with the same keys, and end (returned, or ended by the mode
// set off): each Idempotency-Key is admitted exactly once, whichever path
// and whether a lease was live, every other use answers its admission,
// and the tenant is debited once per key.
func TestExactKeysWhileLeasesFlip(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.tenant(t, "acme", "", rule.Limits{TokensCapacity: 100000, TokensRateMicro: tok})
	r1 := b.replica(t, "r1", 4)
	svc := b.adminOf(t)
	const keys, cost, flips = 24, 10, 12
	var mu sync.Mutex
	answers := map[string]map[string]int{} // key -> admission id -> answers
	note := func(key, id string) {
		mu.Lock()
		defer mu.Unlock()
		if answers[key] == nil {
			answers[key] = map[string]int{}
		}
		answers[key][id]++
	}
	keyOf := func(k int) string { return fmt.Sprintf("key-%d", k) }
	params := func(key string) account.ReserveParams {
		return account.ReserveParams{TenantID: "acme", Estimate: estimate(cost), IdempotencyKey: key, RequestHash: []byte(key), ReplayNow: true}
	}

	stop := make(chan struct{})
	flipped := make(chan error, 1)
	go func() { // the lease side: mode on, take, journal keys, end
		var err error
		defer func() { flipped <- err }()
		for i := 0; i < flips; i++ {
			if _, err = svc.TenantLeaseModeSet(ctx, lease.SetModeParams{TenantID: "acme", Mode: lease.ModeAuto}); err != nil {
				return
			}
			var l lease.Lease
			if l, err = b.r.leases.Take(ctx, lease.TakeParams{TenantID: "acme", WantMicro: 200 * tok}); err != nil {
				return
			}
			for k := i % 3; k < keys; k += 3 {
				key := keyOf(k)
				id := rule.NewStoreAdmissionID(b.clock())
				var re *lease.ReplayError
				switch aerr := b.r.journal.Append(ctx, l.ID, admissionOf(id, params(key))); {
				case aerr == nil:
					note(key, id)
				case errors.As(aerr, &re):
					note(key, re.AdmissionID)
				case errors.Is(aerr, lease.ErrOver):
				default:
					err = aerr
					return
				}
			}
			if i%2 == 0 {
				_, err = b.r.leases.Return(ctx, l.ID)
			} else {
				_, err = svc.TenantLeaseModeSet(ctx, lease.SetModeParams{TenantID: "acme", Mode: lease.ModeOff})
			}
			if err != nil {
				return
			}
		}
	}()
	var wg sync.WaitGroup
	stores := []*account.Store{b.r.acct, r1.acct}
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for round := 0; ; round++ {
				for k := g % 2; k < keys; k += 2 {
					key := keyOf(k)
					r, err := stores[(g+round)%2].Reserve(ctx, params(key))
					if err != nil {
						t.Error(err)
						return
					}
					note(key, r.AdmissionID)
				}
				select {
				case <-stop:
					return
				default:
				}
			}
		}()
	}
	err := <-flipped
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatalf("the lease side: %v", err)
	}
	var live int
	if err := b.r.pool.QueryRow(ctx, "SELECT count(*) FROM leases WHERE state = 'live'").Scan(&live); err != nil || live != 0 {
		t.Fatalf("%d live leases after the flips (%v)", live, err)
	}
	for k := range keys {
		key := keyOf(k)
		if len(answers[key]) != 1 {
			t.Fatalf("%s answered as %d admissions: %v", key, len(answers[key]), answers[key])
		}
	}
	b.keyedOnce(t, "acme", keys, 100000, cost)
}
