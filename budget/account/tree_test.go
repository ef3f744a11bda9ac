package account_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
)

func (b *testBundle) child(t *testing.T, id, parent string, l rule.Limits) {
	t.Helper()
	if _, err := b.store.CreateTenant(ctx, account.CreateTenantParams{ID: id, Parent: parent, Limits: l, Actor: "test"}); err != nil {
		t.Fatal(err)
	}
}

// levelEntries is one level's ledger, per admission: reserve entries and
// the costs they name, and how many entries of each kind each admission got.
func levelEntries(t *testing.T, b *testBundle, id string) (reserved map[string]int64, kinds map[string]map[string]int) {
	t.Helper()
	rows, err := b.pool.Query(ctx, `SELECT kind, admission_id, coalesce(estimate, 0) FROM ledger_entries
		WHERE tenant_id = $1 AND admission_id IS NOT NULL ORDER BY seq`, id)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	reserved, kinds = map[string]int64{}, map[string]map[string]int{}
	for rows.Next() {
		var kind, adm string
		var est int64
		if err := rows.Scan(&kind, &adm, &est); err != nil {
			t.Fatal(err)
		}
		if kinds[adm] == nil {
			kinds[adm] = map[string]int{}
		}
		kinds[adm][kind]++
		if kind == "reserve" {
			reserved[adm] = est
		}
	}
	return reserved, kinds
}

// A three-level tree over two replicas (two pools, each through its own
// pipeline, so batches mix the leaves of one organisation): org -> teams
// a, b -> tenants a1, a2, b1. Each level has the limit that binds it, and
// every level's bound holds exactly; every admission is in the ledger of
// each of its levels exactly once, and nothing else is.
func TestNestedBudgetsExactAtEveryLevel(t *testing.T) {
	t.Parallel()
	b, stores := replicas(t)
	rate := "0.000001" // no refill to speak of: the bounds below are exact
	org := limits(6000, rate)
	org.MaxConcurrent = 40
	b.tenant(t, "org", org)
	teamA := limits(4000, rate)
	teamA.RequestsCapacity, teamA.RequestsRateMicro = 150, 1
	b.child(t, "a", "org", teamA)
	b.child(t, "b", "org", limits(2500, rate))
	b.child(t, "a1", "a", limits(1_000_000, rate))
	a2 := limits(1500, rate)
	b.child(t, "a2", "a", a2)
	b.child(t, "b1", "b", limits(1_000_000, rate))

	pipes := []*account.Pipeline{account.NewPipeline(stores[0], nil), account.NewPipeline(stores[1], nil)}
	leaves := []string{"a1", "a2", "b1"}
	var mu sync.Mutex
	admitted := map[string]int64{} // admission -> cost, as callers saw it
	byLeaf := map[string]int64{}
	refusedBy := map[string]int{}
	hammer(stores, func(g int, _ *account.Store) {
		pipe := pipes[g%2]
		for i := range 6 {
			leaf := leaves[(g+i)%3]
			cost := int64(5 + (g*7+i*13)%45)
			p := reserveFor(leaf, cost)
			r, err := pipe.Reserve(ctx, p)
			var rej *rule.RejectedError
			switch {
			case errors.As(err, &rej):
				mu.Lock()
				refusedBy[rej.Level+"/"+string(rej.Limit)]++
				mu.Unlock()
				continue
			case err != nil:
				t.Error(err)
				return
			}
			mu.Lock()
			admitted[r.AdmissionID] = cost
			byLeaf[leaf] += cost
			mu.Unlock()
			{ // settled at the estimate: the slot comes back, the tokens stay spent
				in, out := p.Estimate.InputTokens, p.Estimate.OutputTokens
				if _, err := pipe.Settle(ctx, account.SettleParams{TenantID: leaf, AdmissionID: r.AdmissionID, InputTokens: in, OutputTokens: out}); err != nil {
					t.Error(err)
					return
				}
			}
		}
	})
	if t.Failed() {
		return
	}
	subtree := map[string][]string{"org": {"a1", "a2", "b1"}, "a": {"a1", "a2"}, "b": {"b1"}, "a1": {"a1"}, "a2": {"a2"}, "b1": {"b1"}}
	capacity := map[string]int64{"org": 6000, "a": 4000, "b": 2500, "a1": 1_000_000, "a2": 1500, "b1": 1_000_000}
	for level, leavesOf := range subtree {
		reserved, kinds := levelEntries(t, b, level)
		var want, got int64
		for _, l := range leavesOf {
			want += byLeaf[l]
		}
		for adm, cost := range reserved {
			if admitted[adm] != cost {
				t.Fatalf("%s: the ledger holds admission %s at %d; callers saw %d", level, adm, cost, admitted[adm])
			}
			got += cost
		}
		for adm, k := range kinds {
			if k["reserve"] != 1 || k["settle"] > 1 {
				t.Fatalf("%s: admission %s has entries %v", level, adm, k)
			}
		}
		if got != want {
			t.Fatalf("%s: its ledger debited %d; its subtree's callers were admitted %d (a rejection consumed something, or a level was skipped)", level, got, want)
		}
		sum := sums(t, b, level)
		tally := b.verify(t, level)
		// Exact: everything a level admitted came from its capacity plus its refill.
		if got*rule.Micro != capacity[level]*rule.Micro+sum.refill-tally.BalanceMicro {
			t.Fatalf("%s: admitted %d, capacity %d + refill %d - balance %d", level, got, capacity[level], sum.refill, tally.BalanceMicro)
		}
		if sum.minReserveBalance < 0 {
			t.Fatalf("%s: a reserve left the balance at %d", level, sum.minReserveBalance)
		}
		if sum.maxOpen > 40 {
			t.Fatalf("%s: %d reservations open at once, the organisation allows 40", level, sum.maxOpen)
		}
	}
	reservedA, _ := levelEntries(t, b, "a")
	if len(reservedA) > 150 {
		t.Fatalf("team a admitted %d requests; its request bucket holds 150", len(reservedA))
	}
	// Demand exceeded the tree (which level is named is pinned by the
	// deterministic test below: the longest-lasting level's first limit).
	if len(refusedBy) == 0 {
		t.Fatalf("no rejection: the test did not load the tree")
	}
	t.Logf("admitted %d requests; rejections by level/limit: %v", len(admitted), refusedBy)
}

// The rejection names the level and the limit, lasts as long as the
// longest refusing level, and consumes nothing at any level.
func TestNestedRejectionNamesTheLevelAndConsumesNothing(t *testing.T) {
	t.Parallel()
	b, clock := setupFrozen(t)
	b.tenant(t, "org", limits(100, "1"))
	team := limits(1000, "10")
	team.MaxConcurrent = 1
	b.child(t, "team", "org", team)
	b.child(t, "key", "team", limits(1000, "100"))
	first := b.mustReserve(t, "key", 60)
	before := map[string]state{}
	for _, id := range []string{"org", "team", "key"} {
		before[id] = b.state(t, id)
	}
	_, err := b.reserve(t, "key", 50)
	rej := rejected(t, err, rule.LimitTokens) // org: 40 left, 10 s to refill 10 (longer than team's 1 s concurrency hint)
	if rej.Level != "org" || rej.RetryAfter.Milliseconds() != 10_000 || rej.Snapshot.TenantID != "org" {
		t.Fatalf("rejected by %s/%s after %s (snapshot of %s); want org/tokens after 10s", rej.Level, rej.Limit, rej.RetryAfter, rej.Snapshot.TenantID)
	}
	_, err = b.reserve(t, "key", 5)
	if rej = rejected(t, err, rule.LimitConcurrency); rej.Level != "team" {
		t.Fatalf("rejected by %s, want team's concurrency", rej.Level)
	}
	var tl *rule.TooLargeError
	if _, err := b.reserve(t, "key", 101); !errors.As(err, &tl) || tl.Level != "org" {
		t.Fatalf("a request larger than the org's capacity: %v", err)
	}
	for _, id := range []string{"org", "team", "key"} {
		if after := b.state(t, id); after != before[id] {
			t.Fatalf("%s changed on rejection:\n%+v\n%+v", id, before[id], after)
		}
	}
	// A release refunds every level.
	if _, err := b.store.Release(ctx, account.ReleaseParams{TenantID: "key", AdmissionID: first.AdmissionID}); err != nil {
		t.Fatal(err)
	}
	clock.Advance(0)
	for _, id := range []string{"org", "team", "key"} {
		snap, err := b.store.TenantSnapshot(ctx, id)
		if err != nil || snap.Tokens() != snap.Limits.TokensCapacity || snap.OpenReservations != 0 {
			t.Fatalf("%s after the release: %d tokens, %d open (%v)", id, snap.Tokens(), snap.OpenReservations, err)
		}
		b.verify(t, id)
	}
	// A disabled organisation admits nothing below it.
	if _, err := b.store.SetDisabled(ctx, account.SetDisabledParams{TenantID: "org", Disabled: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.reserve(t, "key", 1); !errors.Is(err, rule.ErrTenantDisabled) {
		t.Fatalf("under a disabled organisation: %v", err)
	}
}

func TestTreeShapeIsChecked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.tenant(t, "l1", limits(10, "1"))
	b.child(t, "l2", "l1", limits(10, "1"))
	b.child(t, "l3", "l2", limits(10, "1"))
	b.child(t, "l4", "l3", limits(10, "1"))
	var le *rule.LimitError
	if _, err := b.store.CreateTenant(ctx, account.CreateTenantParams{ID: "l5", Parent: "l4", Limits: limits(10, "1")}); !errors.As(err, &le) || le.Field != "parent" {
		t.Fatalf("a fifth level: %v", err)
	}
	if _, err := b.store.CreateTenant(ctx, account.CreateTenantParams{ID: "x", Parent: "nope", Limits: limits(10, "1")}); !errors.As(err, &le) || le.Field != "parent" {
		t.Fatalf("an unknown parent: %v", err)
	}
	if _, err := b.pool.Exec(ctx, `UPDATE tenants SET parent_id = NULL, path = '{}', depth = 0 WHERE id = 'l2'`); err == nil {
		t.Fatal("the database let a parent change")
	}
	tree, err := b.store.TenantTree(ctx, "l3")
	if err != nil || tree.Snapshot.TenantID != "l1" || len(tree.Children) != 1 || tree.Children[0].Children[0].Children[0].Snapshot.TenantID != "l4" {
		t.Fatalf("tree from l3: %+v %v", tree, err)
	}
	if got := tree.Children[0].Children[0].Children[0].Snapshot.Path; len(got) != 3 || got[0] != "l1" || got[2] != "l3" {
		t.Fatalf("l4's path %v", got)
	}
}

// Expiry of a nested tenant's reservation frees its slot at every level,
// each with its own expire entry, and keeps the estimate charged everywhere.
func TestNestedExpiryFreesEveryLevel(t *testing.T) {
	t.Parallel()
	b, clock := setupFrozen(t)
	org := limits(1000, "0.000001")
	org.MaxConcurrent = 1
	b.tenant(t, "org", org)
	leaf := limits(1000, "0.000001")
	leaf.ReservationTTL = time.Second
	b.child(t, "leaf", "org", leaf)
	r := b.mustReserve(t, "leaf", 100)
	_, err := b.reserve(t, "leaf", 1)
	if rej := rejected(t, err, rule.LimitConcurrency); rej.Level != "org" {
		t.Fatalf("refused by %s", rej.Level)
	}
	clock.Advance(2 * time.Second)
	res, err := b.store.Decide(ctx, "leaf", []account.Op{{Expire: &account.ExpireParams{TenantID: "leaf"}}})
	if err != nil || res[0].Expired != 1 {
		t.Fatalf("expire: %+v %v", res, err)
	}
	for _, id := range []string{"org", "leaf"} {
		snap, err := b.store.TenantSnapshot(ctx, id)
		if err != nil || snap.OpenReservations != 0 || snap.Tokens() != 900 {
			t.Fatalf("%s after expiry: %d open, %d tokens (%v)", id, snap.OpenReservations, snap.Tokens(), err)
		}
		var n int
		if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM ledger_entries WHERE tenant_id = $1 AND kind = 'expire' AND admission_id = $2`,
			id, r.AdmissionID).Scan(&n); err != nil || n != 1 {
			t.Fatalf("%s: %d expire entries (%v)", id, n, err)
		}
		b.verify(t, id)
	}
	b.mustReserve(t, "leaf", 1) // the organisation's slot is free again
}
