package account_test

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
)

// endUserPolicy gives tenant a policy on source user with template l.
func (b *testBundle) endUserPolicy(t *testing.T, tenant string, l rule.Limits, maxEndUsers int, ttl time.Duration) {
	t.Helper()
	_, err := b.store.EndUserPolicySet(ctx, account.EndUserPolicyParams{TenantID: tenant, Source: rule.SourceUser,
		Template: l, MaxEndUsers: maxEndUsers, IdleTTL: ttl, Actor: "test"})
	if err != nil {
		t.Fatal(err)
	}
}

func (b *testBundle) count(t *testing.T, query string, args ...any) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(ctx, query, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// First sight of one end user from 50 goroutines over two replicas: one
// row, one tenant entry, and every caller gets its id.
func TestEndUserFirstSightConcurrentMakesOneRow(t *testing.T) {
	t.Parallel()
	b, stores := replicas(t)
	b.tenant(t, "acme", limits(10_000, "1"))
	b.endUserPolicy(t, "acme", limits(100, "1"), 5, time.Hour)

	want := rule.EndUserTenantID("acme", "alice")
	var wg sync.WaitGroup
	start := make(chan struct{})
	for g := range 50 {
		wg.Go(func() {
			<-start
			id, err := stores[g%2].EndUserEnsure(ctx, "acme", "alice")
			if err != nil || id != want {
				t.Errorf("EndUserEnsure = %q, %v; want %q", id, err, want)
			}
		})
	}
	close(start)
	wg.Wait()
	if n := b.count(t, `SELECT count(*)::int FROM tenants WHERE end_user_of = 'acme'`); n != 1 {
		t.Fatalf("%d end-user rows, want 1", n)
	}
	if n := b.count(t, `SELECT count(*)::int FROM ledger_entries WHERE tenant_id = $1 AND kind = 'tenant'`, want); n != 1 {
		t.Fatalf("%d tenant entries, want 1", n)
	}
	snap, err := b.store.TenantSnapshot(ctx, want)
	if err != nil {
		t.Fatal(err)
	}
	if snap.Limits.TokensCapacity != 100 || len(snap.Path) != 1 || snap.Path[0] != "acme" || snap.Tokens() != 100 {
		t.Fatalf("end user %+v", snap)
	}
	b.verify(t, want)
	b.verify(t, "acme")
}

// 40 distinct end users at once against a cap of 10: exactly 10 are
// created, 30 refused ErrEndUserCap, whatever the interleaving.
func TestEndUserCapExactUnderConcurrency(t *testing.T) {
	t.Parallel()
	b, stores := replicas(t)
	b.tenant(t, "acme", limits(10_000, "1"))
	b.endUserPolicy(t, "acme", limits(100, "1"), 10, time.Hour)

	var ok, capped atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for g := range 40 {
		wg.Go(func() {
			<-start
			_, err := stores[g%2].EndUserEnsure(ctx, "acme", fmt.Sprintf("user-%d", g))
			switch {
			case err == nil:
				ok.Add(1)
			case errors.Is(err, rule.ErrEndUserCap):
				capped.Add(1)
			default:
				t.Error(err)
			}
		})
	}
	close(start)
	wg.Wait()
	if ok.Load() != 10 || capped.Load() != 30 {
		t.Fatalf("%d created, %d refused; want 10 and 30", ok.Load(), capped.Load())
	}
	if n := b.count(t, `SELECT count(*)::int FROM tenants WHERE end_user_of = 'acme'`); n != 10 {
		t.Fatalf("%d end-user rows, want 10", n)
	}
	// A known end user is still served at the cap.
	ids, err := b.store.EndUserList(ctx, "acme", "", 100)
	if err != nil || len(ids) != 10 {
		t.Fatalf("list: %d, %v", len(ids), err)
	}
	if _, err := b.store.EndUserEnsure(ctx, "acme", ids[0].EndUserID); err != nil {
		t.Fatal(err)
	}
}

// Many concurrent admissions of several end users of one tenant, over two
// replicas: nothing above either the end user's or the tenant's limit, and
// every level's chain verifies and accounts for exactly what was admitted.
func TestEndUserBoundsExactAtEndUserAndTenant(t *testing.T) {
	t.Parallel()
	b, stores := replicas(t)
	rate := "0.000001"
	b.tenant(t, "acme", limits(3000, rate))
	b.endUserPolicy(t, "acme", limits(1000, rate), 100, time.Hour)
	var users []string
	for i := range 5 {
		id, err := b.store.EndUserEnsure(ctx, "acme", fmt.Sprintf("u%d", i))
		if err != nil {
			t.Fatal(err)
		}
		users = append(users, id)
	}
	pipes := []*account.Pipeline{account.NewPipeline(stores[0], nil), account.NewPipeline(stores[1], nil)}
	var mu sync.Mutex
	byUser := map[string]int64{}
	admitted := map[string]int64{}
	hammer(stores, func(g int, _ *account.Store) {
		for i := range 5 {
			u := users[(g+i)%len(users)]
			cost := int64(5 + (g*7+i*13)%45)
			r, err := pipes[g%2].Reserve(ctx, reserveFor(u, cost))
			if errors.Is(err, rule.ErrRejected) {
				continue
			}
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			byUser[u] += cost
			admitted[r.AdmissionID] = cost
			mu.Unlock()
		}
	})
	if t.Failed() {
		return
	}
	var total int64
	for _, u := range users {
		total += byUser[u]
		if byUser[u] > 1000 {
			t.Fatalf("end user %s admitted %d, its capacity is 1000", u, byUser[u])
		}
		reserved, _ := levelEntries(t, b, u)
		var got int64
		for adm, c := range reserved {
			if admitted[adm] != c {
				t.Fatalf("%s: ledger holds %s at %d, caller saw %d", u, adm, c, admitted[adm])
			}
			got += c
		}
		tally := b.verify(t, u)
		sum := sums(t, b, u)
		if got != byUser[u] || got*rule.Micro != 1000*rule.Micro+sum.refill-tally.BalanceMicro {
			t.Fatalf("%s: ledger %d, callers %d, balance %d", u, got, byUser[u], tally.BalanceMicro)
		}
	}
	if total > 3000 {
		t.Fatalf("the tenant admitted %d, its capacity is 3000", total)
	}
	reserved, _ := levelEntries(t, b, "acme")
	var got int64
	for _, c := range reserved {
		got += c
	}
	tally := b.verify(t, "acme")
	sum := sums(t, b, "acme")
	if got != total || got*rule.Micro != 3000*rule.Micro+sum.refill-tally.BalanceMicro {
		t.Fatalf("tenant: ledger %d, callers %d, balance %d", got, total, tally.BalanceMicro)
	}
	if total < 2900 {
		t.Fatalf("admitted only %d: the test did not load the tenant's limit", total)
	}
}

// A template change applies to every live end user, each with its limits
// entry; an expired one gets it when revived; the tenant's chain records
// the policy change.
func TestEndUserTemplateChangeAppliesToEndUsers(t *testing.T) {
	t.Parallel()
	b, clock := setupFrozen(t)
	b.tenant(t, "acme", limits(10_000, "1"))
	b.endUserPolicy(t, "acme", limits(100, "1"), 10, time.Hour)
	var ids []string
	for _, u := range []string{"a", "b", "c"} {
		id, err := b.store.EndUserEnsure(ctx, "acme", u)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	b.mustReserve(t, ids[0], 30)
	// c idles out before the change.
	clock.Advance(2 * time.Hour)
	b.mustReserve(t, ids[0], 1)
	b.mustReserve(t, ids[1], 1)
	if n, err := b.store.EndUserExpireIdle(ctx, 100); err != nil || n != 1 {
		t.Fatalf("expired %d, %v; want 1 (c)", n, err)
	}

	b.endUserPolicy(t, "acme", limits(50, "2"), 10, time.Hour)
	for _, id := range ids[:2] {
		snap, err := b.store.TenantSnapshot(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if snap.Limits.TokensCapacity != 50 || snap.Limits.TokensRateMicro != 2*rule.Micro {
			t.Fatalf("%s after the template change: %+v", id, snap.Limits)
		}
		if n := b.count(t, `SELECT count(*)::int FROM ledger_entries WHERE tenant_id = $1 AND kind = 'limits'`, id); n != 1 {
			t.Fatalf("%s: %d limits entries", id, n)
		}
		b.verify(t, id)
	}
	if snap, _ := b.store.TenantSnapshot(ctx, ids[2]); snap.Limits.TokensCapacity != 100 {
		t.Fatalf("an expired end user was changed: %+v", snap.Limits)
	}
	if _, err := b.store.EndUserEnsure(ctx, "acme", "c"); err != nil {
		t.Fatal(err)
	}
	if snap, _ := b.store.TenantSnapshot(ctx, ids[2]); snap.Limits.TokensCapacity != 50 {
		t.Fatalf("a revived end user kept the old template: %+v", snap.Limits)
	}
	// The tenant's chain: the two policy writes.
	if n := b.count(t, `SELECT count(*)::int FROM ledger_entries WHERE tenant_id = 'acme' AND kind = 'limits' AND detail::jsonb->>'event' = 'end_user_policy'`); n != 2 {
		t.Fatalf("%d policy entries in the tenant's chain, want 2", n)
	}
	b.verify(t, "acme")
	b.verify(t, ids[2])
	// The same template again writes no end user's limits.
	b.endUserPolicy(t, "acme", limits(50, "2"), 20, time.Hour)
	if n := b.count(t, `SELECT count(*)::int FROM ledger_entries WHERE tenant_id = $1 AND kind = 'limits'`, ids[0]); n != 1 {
		t.Fatalf("an unchanged template rewrote limits: %d entries", n)
	}
}

// Idle expiry on a frozen clock: an end user with an open reservation
// never expires; an idle one does (sweeper), stops counting toward the
// cap, is refused ErrEndUserExpired until revived, and revival (cap
// applies) keeps what it spent and its chain.
func TestEndUserIdleExpiryAndRevivalKeepSpend(t *testing.T) {
	t.Parallel()
	b, clock := setupFrozen(t)
	b.tenant(t, "acme", limits(10_000, "0.000001"))
	b.endUserPolicy(t, "acme", limits(100, "0.000001"), 1, time.Hour)
	a, err := b.store.EndUserEnsure(ctx, "acme", "a")
	if err != nil {
		t.Fatal(err)
	}
	b.mustReserve(t, a, 40)
	clock.Advance(2 * time.Hour)
	if _, err := b.store.SweepOnce(ctx, nil); err != nil {
		t.Fatal(err)
	}
	// That sweep expired the reservation (its TTL is 10 min), a change:
	// the end user is idle from then on, not before.
	if _, err := b.store.EndUserEnsure(ctx, "acme", "b"); !errors.Is(err, rule.ErrEndUserCap) {
		t.Fatalf("b while a is live: %v, want ErrEndUserCap", err)
	}
	clock.Advance(2 * time.Hour)
	if _, err := b.store.SweepOnce(ctx, nil); err != nil {
		t.Fatal(err)
	}
	list, err := b.store.EndUserList(ctx, "acme", "", 10)
	if err != nil || len(list) != 1 || list[0].ExpiredAt == nil || list[0].EndUserID != "a" {
		t.Fatalf("list %+v, %v", list, err)
	}
	if _, err := b.reserve(t, a, 1); !errors.Is(err, rule.ErrEndUserExpired) {
		t.Fatalf("reserve for an expired end user: %v", err)
	}
	bID, err := b.store.EndUserEnsure(ctx, "acme", "b")
	if err != nil {
		t.Fatalf("b once a expired: %v", err)
	}
	if _, err := b.store.EndUserEnsure(ctx, "acme", "a"); !errors.Is(err, rule.ErrEndUserCap) {
		t.Fatalf("reviving a at the cap: %v, want ErrEndUserCap", err)
	}
	b.mustReserve(t, bID, 1) // open until the sweep expires it: b is not idle before
	clock.Advance(2 * time.Hour)
	if n, err := b.store.EndUserExpireIdle(ctx, 10); err != nil || n != 0 {
		t.Fatalf("expired %d, %v; an end user with an open reservation is not idle", n, err)
	}
	if _, err := b.store.SweepOnce(ctx, nil); err != nil {
		t.Fatal(err)
	}
	clock.Advance(2 * time.Hour)
	if n, err := b.store.EndUserExpireIdle(ctx, 10); err != nil || n != 1 {
		t.Fatalf("expired %d, %v", n, err)
	}
	if got, err := b.store.EndUserEnsure(ctx, "acme", "a"); err != nil || got != a {
		t.Fatalf("revive a: %q, %v", got, err)
	}
	snap, err := b.store.TenantSnapshot(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	if snap.Tokens() != 60 {
		t.Fatalf("revived with %d tokens; it had spent 40 of 100", snap.Tokens())
	}
	tally := b.verify(t, a)
	if tally.BalanceMicro/rule.Micro != 60 {
		t.Fatalf("chain balance %d", tally.BalanceMicro)
	}
	if n := b.count(t, `SELECT count(*)::int FROM ledger_entries WHERE tenant_id = $1 AND kind = 'tenant'`, a); n != 3 {
		t.Fatalf("%d tenant entries (created, expired, revived), want 3", n)
	}
	b.mustReserve(t, a, 10)
	b.verify(t, "acme")
}

func TestEndUserPolicyChecked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.tenant(t, "org", limits(1000, "1"))
	b.child(t, "team", "org", limits(1000, "1"))
	b.child(t, "proj", "team", limits(1000, "1"))
	b.child(t, "leaf", "proj", limits(1000, "1"))
	good := account.EndUserPolicyParams{TenantID: "team", Source: rule.SourceUser, Template: limits(10, "1"), MaxEndUsers: 1, IdleTTL: time.Hour}
	for _, c := range []struct {
		field string
		edit  func(p *account.EndUserPolicyParams)
	}{
		{"source", func(p *account.EndUserPolicyParams) { p.Source = "cookie" }},
		{"header", func(p *account.EndUserPolicyParams) { p.Header = "X-User" }},
		{"header", func(p *account.EndUserPolicyParams) { p.Source = rule.SourceHeader }},
		{"header", func(p *account.EndUserPolicyParams) { p.Source, p.Header = rule.SourceHeader, "X User" }},
		{"template.tokens_capacity", func(p *account.EndUserPolicyParams) { p.Template.TokensCapacity = 0 }},
		{"max_end_users", func(p *account.EndUserPolicyParams) { p.MaxEndUsers = 0 }},
		{"idle_ttl_s", func(p *account.EndUserPolicyParams) { p.IdleTTL = 0 }},
		{"tenant", func(p *account.EndUserPolicyParams) { p.TenantID = "leaf" }},
	} {
		p := good
		c.edit(&p)
		var le *rule.LimitError
		if _, err := b.store.EndUserPolicySet(ctx, p); !errors.As(err, &le) || le.Field != c.field {
			t.Fatalf("want a LimitError on %s, got %v", c.field, err)
		}
	}
	if _, err := b.store.EndUserPolicySet(ctx, account.EndUserPolicyParams{TenantID: "nope", Source: rule.SourceUser,
		Template: limits(10, "1"), MaxEndUsers: 1, IdleTTL: time.Hour}); !errors.Is(err, rule.ErrTenantNotFound) {
		t.Fatal(err)
	}
	p := good
	p.Source, p.Header = rule.SourceHeader, "x-end-user"
	got, err := b.store.EndUserPolicySet(ctx, p)
	if err != nil || got.Header != "X-End-User" {
		t.Fatalf("%+v %v", got, err)
	}
	read, err := b.store.EndUserPolicyGet(ctx, "team")
	if err != nil || read.Header != "X-End-User" || read.Template.TokensCapacity != 10 || read.Template.ReservationTTL != rule.DefaultReservationTTL {
		t.Fatalf("%+v %v", read, err)
	}
	if pol, err := b.store.EndUserPolicyOf(ctx, "team"); err != nil || pol == nil || pol.MaxEndUsers != 1 {
		t.Fatalf("cached policy %+v %v", pol, err)
	}
	id, err := b.store.EndUserEnsure(ctx, "team", "u")
	if err != nil {
		t.Fatal(err)
	}
	// An end user cannot have end users (it is at the depth's end anyway).
	p = good
	p.TenantID = id
	var le *rule.LimitError
	if _, err := b.store.EndUserPolicySet(ctx, p); !errors.As(err, &le) || le.Field != "tenant" {
		t.Fatal(err)
	}
	// A disabled tenant (or ancestor) makes no end user: it admits nothing.
	if _, err := b.store.SetDisabled(ctx, account.SetDisabledParams{TenantID: "org", Disabled: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.EndUserEnsure(ctx, "team", "w"); !errors.Is(err, rule.ErrTenantDisabled) {
		t.Fatalf("end user of a disabled tree: %v", err)
	}
	if _, err := b.store.SetDisabled(ctx, account.SetDisabledParams{TenantID: "org", Disabled: false}); err != nil {
		t.Fatal(err)
	}
	var pe *rule.LimitError
	if _, err := b.store.CreateTenant(ctx, account.CreateTenantParams{ID: "below", Parent: id, Limits: limits(1, "1")}); !errors.As(err, &pe) || pe.Field != "parent" {
		t.Fatalf("a tenant below an end user: %v", err)
	}
	if err := b.store.EndUserPolicyDelete(ctx, "team", "test"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.EndUserPolicyGet(ctx, "team"); !errors.Is(err, rule.ErrNoEndUserPolicy) {
		t.Fatal(err)
	}
	if pol, _ := b.store.EndUserPolicyOf(ctx, "team"); pol != nil {
		t.Fatal("the replica's copy kept a deleted policy")
	}
	if _, err := b.store.EndUserEnsure(ctx, "team", "v"); !errors.Is(err, rule.ErrNoEndUserPolicy) {
		t.Fatal(err)
	}
	b.verify(t, "team")
}

// End users whose template has a money window: each end user's window
// and its tenant's count what the ledger's money deltas say, exactly, and
// neither passes its limit, with 200 callers over two replicas.
func TestEndUserMoneyWindowsExact(t *testing.T) {
	t.Parallel()
	b, stores := replicas(t)
	price(t, b, "gpt-4o", time.Now().Add(-time.Hour), 1_000_000, 1_000_000) // one micro-unit a token
	day, err := rule.ParseWindow("day", "Europe/Berlin", "", "")
	if err != nil {
		t.Fatal(err)
	}
	money := func(limit int64) []rule.WindowLimit {
		return []rule.WindowLimit{{Name: "daily", Window: day, Counts: rule.CountMoney, Limit: limit}}
	}
	tl := limits(1_000_000, "1000")
	tl.Windows = money(3000)
	b.tenant(t, "acme", tl)
	ul := limits(1_000_000, "1000")
	ul.Windows = money(1000)
	b.endUserPolicy(t, "acme", ul, 100, time.Hour)
	var users []string
	for i := range 5 {
		id, err := b.store.EndUserEnsure(ctx, "acme", fmt.Sprintf("u%d", i))
		if err != nil {
			t.Fatal(err)
		}
		users = append(users, id)
	}
	hammer(stores, func(g int, s *account.Store) {
		for i := range 5 {
			u := users[(g+i)%len(users)]
			if _, err := s.Reserve(ctx, reserveFor(u, int64(5+(g*7+i*13)%45))); err != nil && !errors.Is(err, rule.ErrRejected) {
				t.Error(err)
				return
			}
		}
	})
	used := func(id string) (window, ledgerSum int64) {
		snap, err := b.store.TenantSnapshot(ctx, id)
		if err != nil || len(snap.Windows) != 1 {
			t.Fatalf("%s: %+v %v", id, snap.Windows, err)
		}
		if err := b.pool.QueryRow(ctx, `SELECT coalesce(sum(money_micro), 0) FROM ledger_entries WHERE tenant_id = $1`, id).Scan(&ledgerSum); err != nil {
			t.Fatal(err)
		}
		return snap.Windows[0].Used, ledgerSum
	}
	var total int64
	for _, u := range users {
		w, l := used(u)
		if w != l || w > 1000 {
			t.Fatalf("end user %s: window %d, ledger %d, limit 1000", u, w, l)
		}
		total += w
	}
	if w, l := used("acme"); w != l || w != total || w > 3000 || w < 3000-50 {
		t.Fatalf("tenant: window %d, ledger %d, end users %d, limit 3000", w, l, total)
	}
}
