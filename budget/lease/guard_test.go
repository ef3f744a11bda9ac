package lease_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/admin"
	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/budget/lease"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/ledger"
)

// adminOf is the administration of the bundle's database on its first
// replica's stores (the frozen clock).
func (b *testBundle) adminOf(t *testing.T) *admin.Service {
	t.Helper()
	svc, err := admin.New(admin.Config{DB: b.r.pool, Store: b.r.acct, Leases: b.r.leases})
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

func (b *testBundle) leaseState(t *testing.T, id string) (state string, slice, used, booked int64) {
	t.Helper()
	err := b.r.pool.QueryRow(context.Background(), "SELECT state, slice_micro, used_micro, booked_micro FROM leases WHERE id = $1", id).Scan(&state, &slice, &used, &booked)
	if err != nil {
		t.Fatal(err)
	}
	return state, slice, used, booked
}

// journaled counts the admissions made from a lease, booked or not.
func (b *testBundle) journaled(t *testing.T, leaseID string) int64 {
	t.Helper()
	var n int64
	if err := b.r.pool.QueryRow(context.Background(), `SELECT count(*) FROM admissions WHERE lease_id = $1`, leaseID).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// admissionRows counts the admissions rows of a lease's journaled
// admissions: a lease ended (by a return, a sweep or an admin change)
// has booked every one.
func (b *testBundle) admissionRows(t *testing.T, leaseID string) int64 {
	t.Helper()
	var n int64
	if err := b.r.pool.QueryRow(context.Background(), `SELECT count(*) FROM admissions a WHERE a.state = 'reserved'
		AND a.id IN (SELECT admission_id FROM ledger_entries WHERE kind = 'reserve' AND detail::jsonb->>'lease' = $1)`, leaseID).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// An admin change that takes a tenant out of leasing (disable, new limits,
// a model scope, lease mode off) ends its live leases and its
// descendants' in its own transaction: the journal refuses the next
// admission of either at once, the tenant's own lease is booked and its
// unused part refunded (a lease_return entry at every level), the
// descendant's is ended right after, and every chain verifies.
func TestAdminChangesEndLeases(t *testing.T) {
	t.Parallel()
	changes := map[string]func(ctx context.Context, svc *admin.Service) error{
		"disable": func(ctx context.Context, svc *admin.Service) error {
			_, err := svc.TenantSetDisabled(ctx, account.SetDisabledParams{TenantID: "acme", Disabled: true, Reason: "unpaid"})
			return err
		},
		"limits": func(ctx context.Context, svc *admin.Service) error {
			_, err := svc.TenantLimitsUpdate(ctx, account.UpdateLimitsParams{TenantID: "acme", Patch: rule.LimitsPatch{TokensCapacity: rule.Set[int64](2000)}})
			return err
		},
		"mode off": func(ctx context.Context, svc *admin.Service) error {
			_, err := svc.TenantLeaseModeSet(ctx, lease.SetModeParams{TenantID: "acme", Mode: lease.ModeOff})
			return err
		},
		"model scope": func(ctx context.Context, svc *admin.Service) error {
			_, err := svc.TenantModelsSet(ctx, account.SetModelsParams{TenantID: "acme", Models: []string{"gpt-4o"}})
			return err
		},
	}
	for name, change := range changes {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := context.Background()
			svc := b.adminOf(t)
			b.tenant(t, "org", "", rule.Limits{TokensCapacity: 5000, TokensRateMicro: tok})
			b.tenant(t, "acme", "org", rule.Limits{TokensCapacity: 1000, TokensRateMicro: tok})
			b.tenant(t, "team", "acme", rule.Limits{TokensCapacity: 300, TokensRateMicro: tok})
			if _, err := svc.TenantLeaseModeSet(ctx, lease.SetModeParams{TenantID: "acme", Mode: lease.ModeAuto}); err != nil {
				t.Fatal(err)
			}
			own, err := b.r.leases.Take(ctx, lease.TakeParams{TenantID: "acme", WantMicro: 400 * tok})
			if err != nil {
				t.Fatal(err)
			}
			below, err := b.r.leases.Take(ctx, lease.TakeParams{TenantID: "team", WantMicro: 200 * tok})
			if err != nil {
				t.Fatal(err)
			}
			for i := range 3 {
				if err := b.r.journal.Append(ctx, own.ID, adm(fmt.Sprintf("own-%d", i), 10)); err != nil {
					t.Fatal(err)
				}
				if err := b.r.journal.Append(ctx, below.ID, adm(fmt.Sprintf("below-%d", i), 20)); err != nil {
					t.Fatal(err)
				}
			}
			if err := change(ctx, svc); err != nil {
				t.Fatal(err)
			}
			for _, id := range []string{own.ID, below.ID} {
				if err := b.r.journal.Append(ctx, id, adm("after-"+id, 1)); !errors.Is(err, lease.ErrOver) {
					t.Fatalf("append to %s after the change: %v, want ErrOver", id, err)
				}
			}
			for _, l := range []struct {
				id, state string
				used      int64
			}{{own.ID, "returned", 30 * tok}, {below.ID, "expired", 60 * tok}} {
				state, _, used, booked := b.leaseState(t, l.id)
				if state != l.state || used != l.used || booked != used {
					t.Fatalf("lease %s: %s, used %d, booked %d; want %s, used and booked %d", l.id, state, used, booked, l.state, l.used)
				}
			}
			// acme's lease gave back 370 tokens at org and acme; team's
			// gave back 140 at every level of its tree.
			for _, lv := range []struct {
				id            string
				returns, back int64
			}{{"org", 2, 510 * tok}, {"acme", 2, 510 * tok}, {"team", 1, 140 * tok}} {
				if n, delta, _ := b.kindSum(t, lv.id, ledger.KindLeaseReturn); n != lv.returns || delta != lv.back {
					t.Errorf("%s: %d lease_return entries giving back %d; want %d giving back %d", lv.id, n, delta, lv.returns, lv.back)
				}
				b.verify(t, lv.id)
			}
			if name == "disable" || name == "model scope" {
				if _, err := b.r.leases.Take(ctx, lease.TakeParams{TenantID: "acme", WantMicro: tok}); !errors.Is(err, lease.ErrExactOnly) {
					t.Errorf("take after the change: %v, want ErrExactOnly", err)
				}
			}
		})
	}
}

// A disable while eight goroutines on two replicas journal into the
// tenant's lease and its child's (most groups hold both lease rows, as the
// disable does): every admission accepted is booked, none is journaled
// after the disable commits, the rest of each slice is refunded, and the
// chains verify.
func TestDisableWhileJournaling(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	svc := b.adminOf(t)
	other := b.replica(t, "r1", 4)
	b.tenant(t, "acme", "", rule.Limits{TokensCapacity: 100000, TokensRateMicro: tok})
	b.tenant(t, "team", "acme", rule.Limits{TokensCapacity: 100000, TokensRateMicro: tok})
	own, err := b.r.leases.Take(ctx, lease.TakeParams{TenantID: "acme", WantMicro: 40000 * tok})
	if err != nil {
		t.Fatal(err)
	}
	below, err := b.r.leases.Take(ctx, lease.TakeParams{TenantID: "team", WantMicro: 40000 * tok})
	if err != nil {
		t.Fatal(err)
	}
	ids := []string{own.ID, below.ID}
	var accepted [2]atomic.Int64
	started := make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			j := b.r.journal
			if w%2 == 1 {
				j = other.journal // a second replica's journal, its own connections
			}
			k := (w / 2) % 2
			for i := 0; ; i++ {
				if i == 20 {
					once.Do(func() { close(started) })
				}
				err := j.Append(ctx, ids[k], adm(fmt.Sprintf("%d-%d", w, i), 3))
				if errors.Is(err, lease.ErrOver) {
					return
				}
				if err != nil {
					t.Error(err)
					return
				}
				accepted[k].Add(3 * tok)
			}
		}()
	}
	<-started
	if _, err := svc.TenantSetDisabled(ctx, account.SetDisabledParams{TenantID: "acme", Disabled: true}); err != nil {
		t.Fatal(err)
	}
	atDisable := [2]int64{b.journaled(t, own.ID), b.journaled(t, below.ID)}
	wg.Wait()
	for k, id := range ids {
		if got := b.journaled(t, id); got != atDisable[k] {
			t.Fatalf("lease %d: %d admissions journaled after the disable committed", k, got-atDisable[k])
		}
		if got := b.admissionRows(t, id); got != atDisable[k] {
			t.Fatalf("lease %d: %d admissions rows for %d journaled admissions: the disable's booking wrote no rows", k, got, atDisable[k])
		}
		state, _, used, booked := b.leaseState(t, id)
		_, _, est := b.kindSumRef(t, "acme", id)
		if state != []string{"returned", "expired"}[k] || used != accepted[k].Load() || booked != used || est*tok != used || used != atDisable[k]*3*tok {
			t.Fatalf("lease %d %s: accepted %d, used %d, booked %d, in the ledger %d, journaled %d", k, state, accepted[k].Load(), used, booked, est*tok, atDisable[k])
		}
	}
	used := accepted[0].Load() + accepted[1].Load()
	if n, back, _ := b.kindSum(t, "acme", ledger.KindLeaseReturn); n != 2 || back != 80000*tok-used {
		t.Fatalf("%d lease_return entries giving back %d, want 2 giving back %d", n, back, 80000*tok-used)
	}
	if got := b.balance(t, "acme"); got != 100000*tok-used {
		t.Fatalf("acme balance %d, want the capacity less the %d admitted", got, used)
	}
	if got := b.balance(t, "team"); got != 100000*tok-accepted[1].Load() {
		t.Fatalf("team balance %d, want the capacity less the %d admitted", got, accepted[1].Load())
	}
	b.verify(t, "acme")
	b.verify(t, "team")
}

// The journal checks an admission's key as a decision does: a key
// revoked, unknown or another tenant's refuses it (rule.ErrKeyRevoked), a
// model outside the key's scope too (*rule.ModelNotAllowedError), while the
// group's other admissions commit; the lease's use counts only those.
func TestJournalKeyRules(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.tenant(t, "acme", "", rule.Limits{TokensCapacity: 1000, TokensRateMicro: tok})
	b.tenant(t, "rival", "", rule.Limits{TokensCapacity: 1000, TokensRateMicro: tok})
	scoped, _, err := credential.KeyCreateRecorded(ctx, b.r.acct, "acme", []string{"gpt-4o*"}, "ops")
	if err != nil {
		t.Fatal(err)
	}
	open, _, err := credential.KeyCreateRecorded(ctx, b.r.acct, "acme", nil, "ops")
	if err != nil {
		t.Fatal(err)
	}
	theirs, _, err := credential.KeyCreateRecorded(ctx, b.r.acct, "rival", nil, "ops")
	if err != nil {
		t.Fatal(err)
	}
	l, err := b.r.leases.Take(ctx, lease.TakeParams{TenantID: "acme", WantMicro: 500 * tok})
	if err != nil {
		t.Fatal(err)
	}
	var scopeErr *rule.ModelNotAllowedError
	cases := []struct {
		key, model string
		ok         func(error) bool
	}{
		{scoped.ID, "gpt-4o-mini", func(err error) bool { return err == nil }},
		{scoped.ID, "claude-3", func(err error) bool { return errors.As(err, &scopeErr) && scopeErr.Scope == "key" }},
		{open.ID, "claude-3", func(err error) bool { return err == nil }},
		{"nokey", "gpt-4o", func(err error) bool { return errors.Is(err, rule.ErrKeyRevoked) }},
		{theirs.ID, "gpt-4o", func(err error) bool { return errors.Is(err, rule.ErrKeyRevoked) }},
		{"", "gpt-4o", func(err error) bool { return err == nil }},
	}
	// All at once, so that most share a group.
	errs := make([]error, len(cases))
	var wg sync.WaitGroup
	for i, c := range cases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := adm(fmt.Sprintf("k%d", i), 10)
			a.Estimate.Model, a.KeyID = c.model, c.key
			errs[i] = b.r.journal.Append(ctx, l.ID, a)
		}()
	}
	wg.Wait()
	for i, c := range cases {
		if !c.ok(errs[i]) {
			t.Errorf("key %q, model %s: %v", c.key, c.model, errs[i])
		}
	}
	if _, _, used, _ := b.leaseState(t, l.ID); used != 30*tok || b.journaled(t, l.ID) != 3 {
		t.Fatalf("used %d with %d journaled; want the 3 admitted, %d", used, b.journaled(t, l.ID), 30*tok)
	}
	if _, err := b.r.leases.Return(ctx, l.ID); err != nil {
		t.Fatal(err)
	}
	b.verify(t, "acme")
}

// A key revoked while eight goroutines on two replicas journal with it and
// with another key: no admission with it is journaled after the revoke
// commits, every one answered as made is journaled, and the other key's
// keep committing.
func TestRevokeWhileJournaling(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	svc := b.adminOf(t)
	b.tenant(t, "acme", "", rule.Limits{TokensCapacity: 100000, TokensRateMicro: tok})
	doomed, _, err := credential.KeyCreateRecorded(ctx, b.r.acct, "acme", nil, "ops")
	if err != nil {
		t.Fatal(err)
	}
	kept, _, err := credential.KeyCreateRecorded(ctx, b.r.acct, "acme", nil, "ops")
	if err != nil {
		t.Fatal(err)
	}
	b.revokeWhileJournaling(t, revoking{what: "key", doomed: doomed.ID, kept: kept.ID, refused: rule.ErrKeyRevoked,
		with:   func(a *lease.Admission, id string) { a.KeyID = id },
		revoke: func(ctx context.Context) error { return svc.KeyRevoke(ctx, "acme", doomed.ID, "ops") }})
}

// revoking is a credential revoked while admissions journal with it
// (revokeWhileJournaling): with sets it (doomed, or kept) on an admission,
// and an admission with doomed is refused with refused once revoke
// returned.
type revoking struct {
	what, doomed, kept string
	refused            error
	with               func(a *lease.Admission, id string)
	revoke             func(ctx context.Context) error
}

// revokeWhileJournaling has eight goroutines on two replicas journal on a
// lease of acme, workers 0-3 with the doomed credential and 4-7 with the
// kept one, revokes the doomed one once they are going, and checks that
// nothing with it is journaled after the revoke returns, every admission
// answered as made is journaled, the kept one's go on, and the lease
// counts exactly what was journaled.
func (b *testBundle) revokeWhileJournaling(t *testing.T, rv revoking) {
	t.Helper()
	ctx := context.Background()
	other := b.replica(t, "r1", 4)
	l, err := b.r.leases.Take(ctx, lease.TakeParams{TenantID: "acme", WantMicro: 50000 * tok})
	if err != nil {
		t.Fatal(err)
	}
	var made [2]atomic.Int64 // answered as made: doomed's, kept's
	var revoked atomic.Bool
	var keptAfter atomic.Int64
	started, enough := make(chan struct{}), make(chan struct{})
	var startOnce, enoughOnce sync.Once
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			j := b.r.journal
			if w%2 == 1 {
				j = other.journal
			}
			k, id := 0, rv.doomed // workers 0-3 the doomed credential, 4-7 the kept one
			if w >= 4 {
				k, id = 1, rv.kept
			}
			for i := 0; ; i++ {
				if i == 20 {
					startOnce.Do(func() { close(started) })
				}
				after := revoked.Load()
				a := adm(fmt.Sprintf("%d-%d-%d", k, w, i), 1)
				rv.with(&a, id)
				err := j.Append(ctx, l.ID, a)
				switch {
				case k == 0 && errors.Is(err, rv.refused):
					return
				case err != nil:
					t.Errorf("worker %d: %v", w, err)
					return
				case k == 0 && after:
					t.Errorf("worker %d: an admission with the revoked %s made after the revoke returned", w, rv.what)
					return
				}
				made[k].Add(1)
				if k == 1 && after && keptAfter.Add(1) == 40 {
					enoughOnce.Do(func() { close(enough) })
				}
				select {
				case <-enough:
					return
				default:
				}
			}
		}()
	}
	<-started
	if err := rv.revoke(ctx); err != nil {
		t.Fatal(err)
	}
	revoked.Store(true)
	var atRevoke int64
	if err := b.r.pool.QueryRow(ctx, "SELECT count(*) FROM admissions WHERE lease_id = $1 AND id LIKE '0-%'", l.ID).Scan(&atRevoke); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	var doomedRows, keptRows int64
	if err := b.r.pool.QueryRow(ctx, "SELECT count(*) FILTER (WHERE id LIKE '0-%'), count(*) FILTER (WHERE id LIKE '1-%') FROM admissions WHERE lease_id = $1", l.ID).Scan(&doomedRows, &keptRows); err != nil {
		t.Fatal(err)
	}
	if doomedRows != atRevoke || doomedRows != made[0].Load() {
		t.Fatalf("revoked %s: %d journaled at the revoke, %d at the end, %d answered as made", rv.what, atRevoke, doomedRows, made[0].Load())
	}
	if keptRows != made[1].Load() || keptAfter.Load() < 40 {
		t.Fatalf("kept %s: %d journaled, %d answered as made, %d after the revoke", rv.what, keptRows, made[1].Load(), keptAfter.Load())
	}
	if _, _, used, _ := b.leaseState(t, l.ID); used != (doomedRows+keptRows)*tok {
		t.Fatalf("used %d, want the %d journaled", used, doomedRows+keptRows)
	}
	if _, err := b.r.leases.Return(ctx, l.ID); err != nil {
		t.Fatal(err)
	}
	b.verify(t, "acme")
}

// A revoke waits for a journal group in flight on the tenant's lease (here
// a transaction holding the lease row, as a group does between its use and
// its commit): the group commits before the revoke does, and every group
// after it reads the key revoked.
func TestRevokeWaitsForGroupInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	svc := b.adminOf(t)
	b.tenant(t, "acme", "", rule.Limits{TokensCapacity: 1000, TokensRateMicro: tok})
	k, _, err := credential.KeyCreateRecorded(ctx, b.r.acct, "acme", nil, "ops")
	if err != nil {
		t.Fatal(err)
	}
	l, err := b.r.leases.Take(ctx, lease.TakeParams{TenantID: "acme", WantMicro: 100 * tok})
	if err != nil {
		t.Fatal(err)
	}
	group, err := b.r.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = group.Rollback(ctx) }()
	if _, err := group.Exec(ctx, "SELECT 1 FROM leases WHERE id = $1 FOR UPDATE", l.ID); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- svc.KeyRevoke(ctx, "acme", k.ID, "ops") }()
	// The signal: the revoke's backend waits on a lock.
	for waiting := 0; waiting == 0; {
		select {
		case err := <-done:
			t.Fatalf("the revoke committed (%v) with a journal group of the tenant's lease in flight", err)
		default:
		}
		if err := b.r.pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'").Scan(&waiting); err != nil {
			t.Fatal(err)
		}
	}
	if err := group.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	a := adm("late", 1)
	a.KeyID = k.ID
	if err := b.r.journal.Append(ctx, l.ID, a); !errors.Is(err, rule.ErrKeyRevoked) {
		t.Fatalf("append with the revoked key: %v, want rule.ErrKeyRevoked", err)
	}
}

// A holder whose admission the journal refuses by its key gives its cost
// back to the lease in memory, as the journal gave it back to the lease's
// use: the next admission is paid from the same lease, with no renew.
func TestHolderKeyRefusalGivesBack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	svc := b.adminOf(t)
	b.tenant(t, "acme", "", rule.Limits{TokensCapacity: 1000, TokensRateMicro: tok})
	gone, _, err := credential.KeyCreateRecorded(ctx, b.r.acct, "acme", nil, "ops")
	if err != nil {
		t.Fatal(err)
	}
	good, _, err := credential.KeyCreateRecorded(ctx, b.r.acct, "acme", []string{"gpt-4o"}, "ops")
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.KeyRevoke(ctx, "acme", gone.ID, "ops"); err != nil {
		t.Fatal(err)
	}
	h := lease.NewHolder(b.r.leases, b.r.journal, lease.HolderConfig{TenantID: "acme", SliceMicro: 100 * tok, NowFunc: b.clock})
	a := adm("revoked", 100)
	a.KeyID = gone.ID
	if err := h.Admit(ctx, a); !errors.Is(err, rule.ErrKeyRevoked) {
		t.Fatalf("admit with a revoked key: %v, want rule.ErrKeyRevoked", err)
	}
	a = adm("scoped-out", 100)
	a.KeyID, a.Estimate.Model = good.ID, "claude-3"
	var scopeErr *rule.ModelNotAllowedError
	if err := h.Admit(ctx, a); !errors.As(err, &scopeErr) {
		t.Fatalf("admit of a model outside the key's scope: %v, want *rule.ModelNotAllowedError", err)
	}
	a = adm("made", 100)
	a.KeyID = good.ID
	if err := h.Admit(ctx, a); err != nil {
		t.Fatal(err)
	}
	if n, delta, _ := b.kindSum(t, "acme", ledger.KindLeaseTake); n != 1 || delta != -100*tok {
		t.Fatalf("%d lease_take entries moving %d; want the one take of 100 tokens", n, delta)
	}
	if err := h.Return(ctx); err != nil {
		t.Fatal(err)
	}
	b.verify(t, "acme")
}
