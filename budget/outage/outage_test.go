package outage_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/outage"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
	"github.com/tokengate/tokengate/integration/pgtest"
	"github.com/tokengate/tokengate/ledger"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var ctx = context.Background()

// rp is a request to reserve est, with an Idempotency-Key when key is set.
func rp(e estimator.Estimate, key string) account.ReserveParams {
	p := account.ReserveParams{TenantID: "acme", Estimate: e, Actor: "key:k", IdempotencyKey: key}
	if key != "" {
		p.RequestHash = []byte("hash of " + key)
	}
	return p
}

func est(cost int64) estimator.Estimate {
	return estimator.Estimate{Model: "gpt-4o", InputTokens: cost / 2, OutputTokens: cost - cost/2, Cost: cost,
		InputWeightMicro: estimator.WeightOne, OutputWeightMicro: estimator.WeightOne}
}

type bundle struct {
	store *account.Store
	local *outage.Local
	snap  rule.Snapshot
	now   time.Time
}

func setup(t *testing.T, l rule.Limits, replicas int) *bundle {
	t.Helper()
	return setupWith(t, l, replicas, nil, nil)
}

// setupWith is setup on a pool that configure adjusts (nil: as is), with
// the store deciding at storeClock's time (nil: the database's clock).
func setupWith(t *testing.T, l rule.Limits, replicas int, configure func(*pgxpool.Config), storeClock func() time.Time) *bundle {
	t.Helper()
	pool := pgtest.New(t, configure)
	store := account.NewStore(pool)
	if storeClock != nil {
		store = store.WithClock(storeClock)
	}
	snap, err := store.CreateTenant(ctx, account.CreateTenantParams{ID: "acme", Limits: l})
	if err != nil {
		t.Fatal(err)
	}
	spool, err := outage.OpenSpool(t.TempDir(), "r1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = spool.Close() })
	b := &bundle{store: store, snap: snap, now: time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)}
	b.local = &outage.Local{Replicas: replicas, Replica: "r1", Spool: spool, NowFunc: func() time.Time { return b.now }}
	return b
}

func TestLocalAdmitsItsShareThenRefills(t *testing.T) {
	t.Parallel()
	l := rule.Limits{TokensCapacity: 100, TokensRateMicro: 10 * rule.Micro, MaxConcurrent: 4}
	b := setup(t, l, 2) // this replica's share: 50 tokens, 5/s, 2 open
	if _, err := b.local.Reserve(b.snap, rp(est(30), "")); err != nil {
		t.Fatal(err)
	}
	_, err := b.local.Reserve(b.snap, rp(est(30), ""))
	var rej *rule.RejectedError
	if !errors.As(err, &rej) || rej.Limit != rule.LimitTokens || rej.RetryAfter < 2*time.Second || rej.RetryAfter > 2100*time.Millisecond {
		t.Fatalf("over the share: %v", err)
	}
	b.now = b.now.Add(2 * time.Second) // 10 more tokens: exactly 30
	r2, err := b.local.Reserve(b.snap, rp(est(30), ""))
	if err != nil {
		t.Fatalf("after refill: %v", err)
	}
	// The concurrency share is 2: a third open reservation is refused.
	b.now = b.now.Add(time.Hour)
	if _, err := b.local.Reserve(b.snap, rp(est(1), "")); !errors.As(err, &rej) || rej.Limit != rule.LimitConcurrency {
		t.Fatalf("third open reservation: %v", err)
	}
	if err := b.local.End("acme", r2.AdmissionID, true, 5, 5, "key:k"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.local.Reserve(b.snap, rp(est(1), "")); err != nil {
		t.Fatalf("after a settle freed a slot: %v", err)
	}
	// Too large for the tenant at all: the same answer as the store's.
	var tl *rule.TooLargeError
	if _, err := b.local.Reserve(b.snap, rp(est(101), "")); !errors.As(err, &tl) {
		t.Fatalf("too large: %v", err)
	}
	recs, err := b.local.Spool.Records()
	if err != nil || len(recs) != 4 {
		t.Fatalf("spool: %d records, %v", len(recs), err)
	}
}

// failingStore fails with ErrUnavailable after n calls: the store going
// away again, or this replica crashing, in the middle of a replay.
type failingStore struct {
	*account.Store
	left atomic.Int64
}

func (f *failingStore) ReplayReserve(ctx context.Context, p account.ReplayReserveParams) (bool, error) {
	if f.left.Add(-1) < 0 {
		return false, rule.ErrUnavailable
	}
	return f.Store.ReplayReserve(ctx, p)
}

func TestReplayIsExactlyOnceAcrossInterruptions(t *testing.T) {
	t.Parallel()
	// One token per 11 days: the store replays on the real clock, and at
	// 1/s a second between the first replayed reserve and the last end
	// moved the exact balance checked below.
	b := setup(t, rule.Limits{TokensCapacity: 1000, TokensRateMicro: 1}, 1)
	var ids []string
	for range 6 {
		r, err := b.local.Reserve(b.snap, rp(est(10), ""))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, r.AdmissionID)
	}
	if err := b.local.End("acme", ids[0], true, 2, 3, "key:k"); err != nil {
		t.Fatal(err)
	}
	if err := b.local.End("acme", ids[1], false, 0, 0, "key:k"); err != nil {
		t.Fatal(err)
	}

	// The store fails after three records: the replay stops, keeps the spool.
	fs := &failingStore{Store: b.store}
	fs.left.Store(3)
	if _, err := b.local.Replay(ctx, fs); !errors.Is(err, rule.ErrUnavailable) {
		t.Fatalf("interrupted replay: %v", err)
	}
	if n, _ := b.local.Spool.Len(); n == 0 {
		t.Fatal("an interrupted replay emptied the spool")
	}
	// A crash could also come after applying everything but before the
	// spool is emptied: replay twice more, the second from a copy.
	spoolCopy, err := os.ReadFile(b.local.Spool.Path())
	if err != nil {
		t.Fatal(err)
	}
	rep, err := b.local.Replay(ctx, b.store)
	if err != nil || rep.Records != 8 || rep.Reserved != 3 || rep.Skipped != 3 || rep.Ended != 2 {
		t.Fatalf("resumed replay: %+v %v", rep, err)
	}
	if err := os.WriteFile(b.local.Spool.Path(), spoolCopy, 0o600); err != nil {
		t.Fatal(err)
	}
	again := &outage.Local{Replicas: 1, Replica: "r1", Spool: b.local.Spool}
	rep, err = again.Replay(ctx, b.store)
	if err != nil || rep.Reserved != 0 || rep.Ended != 0 || rep.Skipped != 8 {
		t.Fatalf("replay of an already-applied spool: %+v %v", rep, err)
	}

	// Exactly one reserve per local admission; the settle and release once.
	var reserves, ends int
	entries, _, err := ledger.EntryQuery(ctx, poolOf(t, b), ledger.Filter{TenantID: "acme", Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		switch e.Kind {
		case ledger.KindReserve:
			reserves++
			if e.Actor != "replica:r1" {
				t.Fatalf("replayed reserve's actor %q", e.Actor)
			}
		case ledger.KindSettle, ledger.KindRelease:
			ends++
		}
	}
	if reserves != 6 || ends != 2 {
		t.Fatalf("ledger: %d reserves, %d settles/releases; want 6 and 2", reserves, ends)
	}
	tally, err := ledger.Verify(ctx, poolOf(t, b), "acme")
	if err != nil {
		t.Fatal(err)
	}
	snap, err := b.store.TenantSnapshot(ctx, "acme")
	// 1000, less six reserves of 10, plus the settle's refund (10 - 5) and
	// the release's (10).
	if err != nil || snap.OpenReservations != 4 || tally.BalanceMicro/rule.Micro != 1000-60+5+10 {
		t.Fatalf("after replay: open %d, balance %d (%v)", snap.OpenReservations, tally.BalanceMicro, err)
	}
}

func TestSpoolIgnoresATornLastLine(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, err := outage.OpenSpool(dir, "r")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Append(outage.Record{Kind: outage.KindRelease, AdmissionID: "adm_1", TenantID: "t"}); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(s.Path(), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = f.WriteString(`{"kind":"reserve","admiss`) // a crash mid-write
	f.Close()
	recs, err := s.Records()
	if err != nil || len(recs) != 1 || recs[0].AdmissionID != "adm_1" {
		t.Fatalf("records: %+v %v", recs, err)
	}
}

func poolOf(t *testing.T, b *bundle) ledger.Querier {
	t.Helper()
	return b.store.Pool()
}

// TestRetryAfterReplayIsNotCharged: an admission made during an outage with
// an Idempotency-Key is replayed with its key, so a retry after the outage
// returns it (same id) without a second debit, and a different request
// under that key is refused.
func TestRetryAfterReplayIsNotCharged(t *testing.T) {
	t.Parallel()
	b := setup(t, rule.Limits{TokensCapacity: 1000, TokensRateMicro: 1}, 1)
	r, err := b.local.Reserve(b.snap, rp(est(100), "k1"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.local.Replay(ctx, b.store); err != nil {
		t.Fatal(err)
	}
	before, err := b.store.TenantSnapshot(ctx, "acme")
	if err != nil || before.Tokens() != 900 {
		t.Fatalf("after replay: %d tokens (%v)", before.Tokens(), err)
	}
	retry, err := b.store.Reserve(ctx, rp(est(100), "k1"))
	if err != nil || retry.AdmissionID != r.AdmissionID || !retry.Replayed {
		t.Fatalf("retry after replay: %+v %v; want admission %s replayed", retry, err, r.AdmissionID)
	}
	other := rp(est(100), "k1")
	other.RequestHash = []byte("another request")
	if _, err := b.store.Reserve(ctx, other); !errors.Is(err, rule.ErrIdempotencyMismatch) {
		t.Fatalf("another request under the key: %v", err)
	}
	after, err := b.store.TenantSnapshot(ctx, "acme")
	if err != nil || after.Tokens() != 900 || after.OpenReservations != 1 {
		t.Fatalf("the retry debited again: %d tokens, %d open (%v)", after.Tokens(), after.OpenReservations, err)
	}
}

// TestLocalIdempotencyChecksTheRequest: during an outage, a retry with the
// same key and request gets the same admission; the key with another
// request is refused, as the store would.
func TestLocalIdempotencyChecksTheRequest(t *testing.T) {
	t.Parallel()
	b := setup(t, rule.Limits{TokensCapacity: 1000, TokensRateMicro: rule.Micro}, 1)
	r, err := b.local.Reserve(b.snap, rp(est(100), "k1"))
	if err != nil {
		t.Fatal(err)
	}
	again, err := b.local.Reserve(b.snap, rp(est(100), "k1"))
	if err != nil || again.AdmissionID != r.AdmissionID || !again.Replayed {
		t.Fatalf("same key, same request: %+v %v", again, err)
	}
	other := rp(est(100), "k1")
	other.RequestHash = []byte("another request")
	if _, err := b.local.Reserve(b.snap, other); !errors.Is(err, rule.ErrIdempotencyMismatch) {
		t.Fatalf("same key, another request: %v", err)
	}
	if recs, _ := b.local.Spool.Records(); len(recs) != 1 {
		t.Fatalf("%d spool records; want the one admission", len(recs))
	}
}

// TestTornTailThenRestartLosesNothing: a crash mid-append leaves a torn last
// line; the replica restarts (OpenSpool) and admits more. The torn bytes go
// to the rejected file, and every answered admission, before and after the
// restart, reaches the ledger.
func TestTornTailThenRestartLosesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, rule.Limits{TokensCapacity: 1000, TokensRateMicro: 1}, 1)
	first, err := b.local.Reserve(b.snap, rp(est(10), ""))
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(b.local.Spool.Path(), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = f.WriteString(`{"kind":"reserve","admission_id":"adm_torn","tenant_id":"ac`) // the crash
	f.Close()
	_ = b.local.Spool.Close()

	spool, err := outage.OpenSpool(filepath.Dir(b.local.Spool.Path()), "r1") // the restart
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = spool.Close() })
	if spool.TornBytes() == 0 {
		t.Fatal("the torn tail was not noticed")
	}
	local := &outage.Local{Replicas: 1, Replica: "r1", Spool: spool}
	second, err := local.Reserve(b.snap, rp(est(20), "k2"))
	if err != nil {
		t.Fatal(err)
	}
	rep, err := local.Replay(ctx, b.store)
	if err != nil || rep.Reserved != 2 || rep.Rejected != 0 {
		t.Fatalf("replay after the restart: %+v %v", rep, err)
	}
	for _, id := range []string{first.AdmissionID, second.AdmissionID} {
		if _, err := b.store.AdmissionGet(ctx, "acme", id); err != nil {
			t.Fatalf("admission %s lost: %v", id, err)
		}
	}
	rejected, err := os.ReadFile(spool.RejectedPath())
	if err != nil || !strings.Contains(string(rejected), "adm_torn") || !strings.Contains(string(rejected), "torn tail") {
		t.Fatalf("rejected file: %q %v", rejected, err)
	}
	if n, _ := spool.Len(); n != 0 {
		t.Fatalf("%d bytes left in the spool after a full replay", n)
	}
}

// TestUnreadableLineNeverBlocksTheRest: a line that cannot be parsed, and a
// record the store refuses for good, are moved to the rejected file; the
// records after them are replayed, and the spool is emptied.
func TestUnreadableLineNeverBlocksTheRest(t *testing.T) {
	t.Parallel()
	b := setup(t, rule.Limits{TokensCapacity: 1000, TokensRateMicro: 1}, 1)
	if _, err := b.local.Reserve(b.snap, rp(est(10), "")); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(b.local.Spool.Path(), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = f.WriteString("this is not a record\n")
	f.Close()
	// A reserve for a tenant the store does not know: refused for good.
	ghost := b.snap
	ghost.TenantID = "ghost"
	if _, err := b.local.Reserve(ghost, rp(est(10), "")); err != nil {
		t.Fatal(err)
	}
	last, err := b.local.Reserve(b.snap, rp(est(30), ""))
	if err != nil {
		t.Fatal(err)
	}
	rep, err := b.local.Replay(ctx, b.store)
	if err != nil || rep.Reserved != 2 || rep.Rejected != 2 || rep.Records != 4 {
		t.Fatalf("replay: %+v %v", rep, err)
	}
	if _, err := b.store.AdmissionGet(ctx, "acme", last.AdmissionID); err != nil {
		t.Fatalf("the record after the bad ones was not replayed: %v", err)
	}
	if n, _ := b.local.Spool.Len(); n != 0 || b.local.Spool.Rejected() != 2 {
		t.Fatalf("spool holds %d bytes, %d rejected", n, b.local.Spool.Rejected())
	}
	rejected, _ := os.ReadFile(b.local.Spool.RejectedPath())
	if lines := strings.Count(string(rejected), "\n"); lines != 2 || !strings.Contains(string(rejected), "this is not a record") {
		t.Fatalf("rejected file: %q", rejected)
	}
}

// TestReplayMovesASkewedReplicasClock: a replica's clock may be off the
// database's. Its admissions land with times on the database's clock, so a
// fast clock does not hold a reservation (and its concurrency slot) past
// its TTL, and a slow one does not expire it before the client could
// settle. The replica admits at its t0 and replays 10 s later by its clock:
// in the store the admission was made 10 s ago and expires 50 s from now.
func TestReplayMovesASkewedReplicasClock(t *testing.T) {
	t.Parallel()
	for _, skew := range []time.Duration{time.Hour, -24 * time.Hour} {
		b := setup(t, rule.Limits{TokensCapacity: 1000, TokensRateMicro: rule.Micro, MaxConcurrent: 5, ReservationTTL: time.Minute}, 1)
		var dbNow time.Time
		if err := b.store.Pool().QueryRow(ctx, `SELECT now()`).Scan(&dbNow); err != nil {
			t.Fatal(err)
		}
		b.now = dbNow.Add(skew)
		r, err := b.local.Reserve(b.snap, rp(est(10), ""))
		if err != nil {
			t.Fatal(err)
		}
		b.now = b.now.Add(10 * time.Second)
		if _, err := b.local.Replay(ctx, b.store); err != nil {
			t.Fatal(err)
		}
		var created, expires, now time.Time
		if err := b.store.Pool().QueryRow(ctx, `SELECT created_at, expires_at, now() FROM admissions WHERE id = $1`, r.AdmissionID).
			Scan(&created, &expires, &now); err != nil {
			t.Fatal(err)
		}
		near := func(a, b time.Time) bool { return a.Sub(b).Abs() < 2*time.Second }
		if !near(created, now.Add(-10*time.Second)) || !near(expires, now.Add(50*time.Second)) {
			t.Fatalf("skew %s: created %s, expires %s; the database's now is %s: want now-10s and now+50s", skew, created, expires, now)
		}
		// The sweep does not expire it early, and it holds its slot.
		if n, err := b.store.Expire(ctx, "acme"); err != nil || n != 0 {
			t.Fatalf("skew %s: the sweep expired %d (%v)", skew, n, err)
		}
	}
}

// TestLocalRefusesUsageOutOfBounds: a settle of an admission made here,
// with usage no request could produce (issue 21), is refused as the store
// would refuse it: nothing is journaled and the share does not move. A
// negative usage is refused for any admission.
func TestLocalRefusesUsageOutOfBounds(t *testing.T) {
	t.Parallel()
	b := setup(t, rule.Limits{TokensCapacity: 1000, TokensRateMicro: rule.Micro}, 1)
	r, err := b.local.Reserve(b.snap, rp(est(2), "")) // 1 input, 1 output reserved
	if err != nil {
		t.Fatal(err)
	}
	before, err := b.local.Spool.Records()
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range [][2]int64{{1_000_000_000, 1_000_000_000}, {0, 2}, {128_000, 1}, {-1, 0}} {
		if err := b.local.End("acme", r.AdmissionID, true, u[0], u[1], "key:k"); !errors.Is(err, rule.ErrUsageOutOfBounds) {
			t.Fatalf("settle %v: %v", u, err)
		}
	}
	if err := b.local.End("acme", "adm_of_the_store", true, -5, 1, "key:k"); !errors.Is(err, rule.ErrUsageOutOfBounds) {
		t.Fatalf("negative usage of another admission: %v", err)
	}
	after, err := b.local.Spool.Records()
	if err != nil || len(after) != len(before) {
		t.Fatalf("refused settles were journaled: %d then %d records (%v)", len(before), len(after), err)
	}
	// The full window settles, and its charge stops at the share's floor.
	if err := b.local.End("acme", r.AdmissionID, true, 127_999, 1, "key:k"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.local.Reserve(b.snap, rp(est(1), "")); !errors.Is(err, rule.ErrRejected) {
		t.Fatalf("after a charge to the floor: %v", err)
	}
}

// TestOutageSettlesByKeyAndReplaysThem: during an outage, a settle or
// release naming a store admission by idempotency key is journaled with
// its key and its usage as stated (cached input, a refund), and the replay
// settles it by key, priced by the store as it would have been; one naming
// an admission made here by its key is resolved here and journaled by id.
// A settle naming its admission both ways is refused and not journaled.
func TestOutageSettlesByKeyAndReplaysThem(t *testing.T) {
	t.Parallel()
	b := setup(t, rule.Limits{TokensCapacity: 1000, TokensRateMicro: rule.Micro}, 1)
	// gpt-4o alone, its cached input at half weight.
	table, err := estimator.NewTable([]estimator.Model{{Name: "gpt-4o", Encoding: estimator.EncodingO200K, InputWeightMicro: estimator.WeightOne,
		OutputWeightMicro: estimator.WeightOne, CachedInputWeightMicro: estimator.WeightOne / 2, DefaultOutputTokens: 16384, ContextWindow: 128000, PartTokens: 765}})
	if err != nil {
		t.Fatal(err)
	}
	b.store.WithModels(func() *estimator.Table { return table })
	b.local.ModelsFunc = func() *estimator.Table { return table }
	for _, key := range []string{"rls:r-1", "rls:r-2", "rls:r-3"} {
		if _, err := b.store.Reserve(ctx, rp(est(100), key)); err != nil {
			t.Fatal(err)
		}
	}
	// The store goes away.
	local, err := b.local.Reserve(b.snap, rp(est(10), "loc-1"))
	if err != nil {
		t.Fatal(err)
	}
	for _, err := range []error{
		b.local.Settle(account.SettleParams{TenantID: "acme", IdempotencyKey: "rls:r-1", InputTokens: 40, CachedInputTokens: 30, OutputTokens: 20,
			ReasoningTokens: 5}),
		b.local.Settle(account.SettleParams{TenantID: "acme", IdempotencyKey: "rls:r-2", RefundTokens: 30}),
		b.local.Release(account.ReleaseParams{TenantID: "acme", IdempotencyKey: "rls:r-3"}),
		b.local.Settle(account.SettleParams{TenantID: "acme", IdempotencyKey: "loc-1", InputTokens: 4, CachedInputTokens: 4, OutputTokens: 1}),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	var inv *rule.InvalidError
	if err := b.local.Settle(account.SettleParams{TenantID: "acme", AdmissionID: local.AdmissionID, IdempotencyKey: "loc-1"}); !errors.As(err, &inv) {
		t.Fatalf("named both ways: %v", err)
	}
	recs, err := b.local.Spool.Records()
	if err != nil || len(recs) != 5 {
		t.Fatalf("spool: %d records (%v)", len(recs), err)
	}
	if r := recs[1]; r.AdmissionID != "" || r.IdempotencyKey != "rls:r-1" || r.CachedInputTokens != 30 || r.ReasoningTokens != 5 {
		t.Fatalf("a settle by key of a store admission is journaled by key: %+v", r)
	}
	if r := recs[4]; r.AdmissionID != local.AdmissionID || r.IdempotencyKey != "" {
		t.Fatalf("a settle by key of a local admission is journaled by id: %+v", r)
	}

	spy := &replaySpy{Store: b.store}
	rep, err := b.local.Replay(ctx, spy)
	if err != nil || rep.Reserved != 1 || rep.Ended != 4 || rep.Rejected != 0 {
		t.Fatalf("replay: %+v %v", rep, err)
	}
	if len(spy.settles) != 3 || spy.settles[0].IdempotencyKey != "rls:r-1" || spy.settles[0].ReasoningTokens != 5 {
		t.Fatalf("the replay's settles: %+v", spy.settles)
	}
	for key, want := range map[string]struct {
		state   account.State
		in, out int64
	}{
		"rls:r-1": {account.StateSettled, 10 + 15, 20}, // 30 cached at half weight
		"rls:r-2": {account.StateSettled, 100 - 30, 0},
		"rls:r-3": {account.StateReleased, 0, 0},
	} {
		var id string
		if err := b.store.Pool().QueryRow(ctx, `SELECT admission_id FROM idempotency_keys WHERE tenant_id = 'acme' AND key = $1`, key).Scan(&id); err != nil {
			t.Fatalf("%s: %v", key, err)
		}
		a, err := b.store.AdmissionGet(ctx, "acme", id)
		if err != nil || a.State != want.state || (want.state == account.StateSettled && (*a.ActualInput != want.in || *a.ActualOutput != want.out)) {
			t.Fatalf("%s after the replay: %+v %v", key, a, err)
		}
	}
	a, err := b.store.AdmissionGet(ctx, "acme", local.AdmissionID)
	if err != nil || a.State != account.StateSettled || *a.ActualInput != 2 {
		t.Fatalf("the local admission after the replay: %+v %v", a, err)
	}
	if _, err := ledger.Verify(ctx, poolOf(t, b), "acme"); err != nil {
		t.Fatal(err)
	}
}

// replaySpy is the store a replay writes to, noting the settles it is
// given (their reasoning tokens, which no balance shows).
type replaySpy struct {
	*account.Store
	settles []account.SettleParams
}

func (s *replaySpy) Settle(ctx context.Context, p account.SettleParams) (*account.Settlement, error) {
	s.settles = append(s.settles, p)
	return s.Store.Settle(ctx, p)
}
