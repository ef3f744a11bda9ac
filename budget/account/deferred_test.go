package account_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/ledger"
)

// local is the deferral of a caller that knows no model policy and whose
// replica has no default: the tenant's own policy decides.
var local = &account.Deferral{}

// keptKeys are the keys of the kept settles and releases, in order.
func (b *testBundle) keptKeys(t *testing.T) []string {
	t.Helper()
	rows, err := b.pool.Query(ctx, `SELECT key FROM deferred_settles ORDER BY key, seq`)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

// replayed is the replay of a local admission of cost under key, made at now.
func replayed(tenantID, key string, cost int64, now time.Time) account.ReplayReserveParams {
	return account.ReplayReserveParams{AdmissionID: rule.NewLocalAdmissionID(now), TenantID: tenantID, Estimate: hits(tenantID, cost).Estimate,
		CreatedAt: now, ExpiresAt: now.Add(10 * time.Minute), Replica: "r3", IdempotencyKey: key,
		RequestHash: []byte("hash of " + key), Response: []byte(`{}`)}
}

// TestKeptSettleIsAppliedByTheReplay: a settle by key that finds no
// admission, for a tenant whose requests may be admitted locally, is kept
// (every one of its key, in order) and answered ErrDeferred, which is an
// ErrAdmissionNotFound; the replay of the admission with that key applies
// it in its own transaction (the settle entry carries the settle's actor
// and says it was kept) and deletes it; replaying again changes nothing. A
// release is kept the same way. A settle without a Deferral keeps nothing.
func TestKeptSettleIsAppliedByTheReplay(t *testing.T) {
	t.Parallel()
	b, clock := setupFrozen(t)
	l := limits(1000, "1")
	l.OnStoreUnavailable = rule.PolicyLocal
	b.tenant(t, "acme", l)

	settle := func(key string, in int64) error {
		return fst(b.store.Settle(ctx, account.SettleParams{TenantID: "acme", IdempotencyKey: key, InputTokens: in, Actor: "gateway:edge", Defer: local}))
	}
	if err := settle("rls:a", 6); !errors.Is(err, account.ErrDeferred) || !errors.Is(err, rule.ErrAdmissionNotFound) {
		t.Fatalf("settle before the replay: %v, want ErrDeferred (an ErrAdmissionNotFound)", err)
	}
	if err := settle("rls:a", 9); !errors.Is(err, account.ErrDeferred) {
		t.Fatalf("a second settle of the key: %v", err)
	}
	if err := fst(b.store.Release(ctx, account.ReleaseParams{TenantID: "acme", IdempotencyKey: "rls:b", Actor: "gateway:edge", Defer: local})); !errors.Is(err, account.ErrDeferred) {
		t.Fatalf("release before the replay: %v", err)
	}
	if err := fst(b.store.Settle(ctx, account.SettleParams{TenantID: "acme", IdempotencyKey: "rls:c", InputTokens: 1})); err == nil ||
		errors.Is(err, account.ErrDeferred) || !errors.Is(err, rule.ErrAdmissionNotFound) {
		t.Fatalf("settle without a deferral: %v, want ErrAdmissionNotFound alone", err)
	}
	if keys := b.keptKeys(t); strings.Join(keys, " ") != "rls:a rls:a rls:b" {
		t.Fatalf("kept %v, want rls:a twice and rls:b", keys)
	}

	clock.Advance(time.Second)
	pa := replayed("acme", "rls:a", 12, clock.Now().Add(-time.Minute))
	for range 2 { // a replay that runs again writes nothing
		if _, err := b.store.ReplayReserve(ctx, pa); err != nil {
			t.Fatal(err)
		}
	}
	a, err := b.store.AdmissionGet(ctx, "acme", pa.AdmissionID)
	if err != nil || a.State != account.StateSettled || *a.ActualInput != 6 || *a.ActualCost != 6 {
		t.Fatalf("the replayed admission: %+v %v; want settled at the first kept usage, 6", a, err)
	}
	entries, _, err := ledger.EntryQuery(ctx, b.pool, ledger.Filter{TenantID: "acme", AdmissionID: pa.AdmissionID, Oldest: true, Limit: 10})
	if err != nil || len(entries) != 2 || entries[0].Kind != ledger.KindReserve || entries[1].Kind != ledger.KindSettle {
		t.Fatalf("ledger of the admission: %+v %v; want a reserve and one settle", entries, err)
	}
	if e := entries[1]; e.Actor != "gateway:edge" || !strings.Contains(e.Reason, "kept") || *e.Actual != 6 {
		t.Fatalf("the settle entry: actor %q, reason %q, actual %d", e.Actor, e.Reason, *e.Actual)
	}
	// The admission is in the store now: the key settles it, as a replay.
	if st, err := b.store.Settle(ctx, account.SettleParams{TenantID: "acme", IdempotencyKey: "rls:a", InputTokens: 6, Defer: local}); err != nil || !st.Replayed {
		t.Fatalf("the settle again after the replay: %+v %v", st, err)
	}

	pb := replayed("acme", "rls:b", 20, clock.Now())
	if _, err := b.store.ReplayReserve(ctx, pb); err != nil {
		t.Fatal(err)
	}
	if a, err := b.store.AdmissionGet(ctx, "acme", pb.AdmissionID); err != nil || a.State != account.StateReleased {
		t.Fatalf("the replayed admission of a kept release: %+v %v", a, err)
	}
	if keys := b.keptKeys(t); len(keys) != 0 {
		t.Fatalf("kept %v left after their replays", keys)
	}
	// 1000, less 12 and 20 reserved, plus the settle's refund (6) and the
	// release's (20).
	if tally := b.verify(t, "acme"); tally.BalanceMicro/rule.Micro != 1000-12-20+6+20 {
		t.Fatalf("balance %d", tally.BalanceMicro/rule.Micro)
	}
}

// TestKeptSettleLivesTheIdempotencyWindow: a kept settle older than 24 h is
// not applied by a replay (the key it named is forgotten by then), and the
// sweep purges it; a younger one stays.
func TestKeptSettleLivesTheIdempotencyWindow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	l := limits(1000, "1")
	l.OnStoreUnavailable = rule.PolicyLocal
	b.tenant(t, "acme", l)
	for _, key := range []string{"rls:old", "rls:young"} {
		if err := fst(b.store.Settle(ctx, account.SettleParams{TenantID: "acme", IdempotencyKey: key, InputTokens: 1, Defer: local})); !errors.Is(err, account.ErrDeferred) {
			t.Fatal(err)
		}
	}
	if _, err := b.pool.Exec(ctx, `UPDATE deferred_settles SET created_at = created_at - interval '25 hours' WHERE key = 'rls:old'`); err != nil {
		t.Fatal(err)
	}
	p := replayed("acme", "rls:old", 5, time.Now())
	if _, err := b.store.ReplayReserve(ctx, p); err != nil {
		t.Fatal(err)
	}
	if a, err := b.store.AdmissionGet(ctx, "acme", p.AdmissionID); err != nil || a.State != account.StateReserved {
		t.Fatalf("replayed under a key whose kept settle is older than 24 h: %+v %v", a, err)
	}
	if _, err := b.store.SweepOnce(ctx, nil); err != nil {
		t.Fatal(err)
	}
	keys := b.keptKeys(t)
	if len(keys) != 1 || keys[0] != "rls:young" {
		t.Fatalf("after the sweep: %v; want only rls:young", keys)
	}
}

// TestKeptSettleKeepsItsCacheWrites: a settle kept for an admission not
// replayed yet is priced, when the replay applies it, as it would have been
// at once: its prompt-cache writes at the model's cache-write weights
// (Claude's seeded 1.25 for 5 minutes, 2 for an hour), not as plain input.
func TestKeptSettleKeepsItsCacheWrites(t *testing.T) {
	t.Parallel()
	b, clock := setupFrozen(t)
	l := limits(100_000, "1")
	l.OnStoreUnavailable = rule.PolicyLocal
	b.tenant(t, "acme", l)
	err := fst(b.store.Settle(ctx, account.SettleParams{TenantID: "acme", IdempotencyKey: "rls:w", InputTokens: 300, OutputTokens: 10,
		CacheWriteTokens: 100, CacheWrite1hTokens: 100, Actor: "gateway:edge", Defer: local}))
	if !errors.Is(err, account.ErrDeferred) {
		t.Fatalf("settle before the replay: %v, want ErrDeferred", err)
	}
	clock.Advance(time.Second)
	p := replayed("acme", "rls:w", 2000, clock.Now())
	p.Estimate.Model, p.Estimate.Family, p.Estimate.OutputTokens = "claude-sonnet-4-5", "claude-sonnet-4-5", 100
	if _, err := b.store.ReplayReserve(ctx, p); err != nil {
		t.Fatal(err)
	}
	a, err := b.store.AdmissionGet(ctx, "acme", p.AdmissionID)
	// 100 uncached + 100 x 1.25 + 100 x 2 = 425 input.
	if err != nil || a.State != account.StateSettled || *a.ActualInput != 425 || *a.ActualCost != 435 {
		t.Fatalf("the replayed admission: %+v %v; want settled at 425 input, cost 435", a, err)
	}
	b.verify(t, "acme")
}

// TestKeptSettlesApplyTheFirstAccepted: the settles kept for one key are
// applied as the live path would have decided them, in the order they
// came: one with usage no request could produce (answered OK by the
// stream end's face, since nothing could be checked before the replay) is
// refused and moves nothing, and the next one settles the admission; a
// release after it is a conflict and moves nothing. (Found by the soak on
// Patroni: keeping only the first row dropped the real usage, and the
// reservation expired at its estimate.) A key keeps at most 8.
func TestKeptSettlesApplyTheFirstAccepted(t *testing.T) {
	t.Parallel()
	b, clock := setupFrozen(t)
	l := limits(1_000_000, "1")
	l.OnStoreUnavailable = rule.PolicyLocal
	b.tenant(t, "acme", l)
	settle := func(key string, in int64) {
		t.Helper()
		if err := fst(b.store.Settle(ctx, account.SettleParams{TenantID: "acme", IdempotencyKey: key, InputTokens: in, Actor: "gateway:edge", Defer: local})); !errors.Is(err, account.ErrDeferred) {
			t.Fatalf("settle %s with %d: %v, want ErrDeferred", key, in, err)
		}
	}
	settle("rls:x", 1_000_000_000) // beyond any context window
	settle("rls:x", 7)
	if err := fst(b.store.Release(ctx, account.ReleaseParams{TenantID: "acme", IdempotencyKey: "rls:x", Actor: "gateway:edge", Defer: local})); !errors.Is(err, account.ErrDeferred) {
		t.Fatal(err)
	}
	for range 10 {
		settle("rls:many", 3)
	}
	if keys := b.keptKeys(t); strings.Count(strings.Join(keys, " "), "rls:many") != 8 || strings.Count(strings.Join(keys, " "), "rls:x") != 3 {
		t.Fatalf("kept %v, want rls:many 8 times and rls:x 3 times", keys)
	}

	clock.Advance(time.Second)
	before := balance(t, b, "acme")
	p := replayed("acme", "rls:x", 12, clock.Now())
	if _, err := b.store.ReplayReserve(ctx, p); err != nil {
		t.Fatal(err)
	}
	a, err := b.store.AdmissionGet(ctx, "acme", p.AdmissionID)
	if err != nil || a.State != account.StateSettled || *a.ActualInput != 7 || *a.ActualCost != 7 {
		t.Fatalf("the replayed admission: %+v %v; want settled at the second kept usage, 7", a, err)
	}
	if got := balance(t, b, "acme"); got != before-7 {
		t.Fatalf("balance %d after the replay, want %d - 7", got, before)
	}
	entries, _, err := ledger.EntryQuery(ctx, b.pool, ledger.Filter{TenantID: "acme", AdmissionID: p.AdmissionID, Oldest: true, Limit: 10})
	if err != nil || len(entries) != 2 || entries[1].Kind != ledger.KindSettle || *entries[1].Actual != 7 {
		t.Fatalf("ledger of the admission: %+v %v; want a reserve and one settle of 7", entries, err)
	}
	pm := replayed("acme", "rls:many", 12, clock.Now())
	if _, err := b.store.ReplayReserve(ctx, pm); err != nil {
		t.Fatal(err)
	}
	if a, err := b.store.AdmissionGet(ctx, "acme", pm.AdmissionID); err != nil || a.State != account.StateSettled || *a.ActualInput != 3 {
		t.Fatalf("the admission of rls:many: %+v %v", a, err)
	}
	if keys := b.keptKeys(t); len(keys) != 0 {
		t.Fatalf("kept %v left after their replays", keys)
	}
	b.verify(t, "acme")
}
