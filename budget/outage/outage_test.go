package outage_test

import (
	"context"
	"errors"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokengate/tokengate/budget"
	"github.com/tokengate/tokengate/budget/outage"
	"github.com/tokengate/tokengate/estimator"
	"github.com/tokengate/tokengate/integration/pgtest"
	"github.com/tokengate/tokengate/ledger"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var ctx = context.Background()

func est(cost int64) estimator.Estimate {
	return estimator.Estimate{Model: "gpt-4o", InputTokens: cost / 2, OutputTokens: cost - cost/2, Cost: cost,
		InputWeightMicro: estimator.WeightOne, OutputWeightMicro: estimator.WeightOne}
}

type bundle struct {
	store *budget.Store
	local *outage.Local
	snap  budget.Snapshot
	now   time.Time
}

func setup(t *testing.T, l budget.Limits, replicas int) *bundle {
	t.Helper()
	pool := pgtest.New(t, nil)
	store := budget.NewStore(pool)
	snap, err := store.CreateTenant(ctx, budget.CreateTenantParams{ID: "acme", Limits: l})
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
	l := budget.Limits{TokensCapacity: 100, TokensRateMicro: 10 * budget.Micro, MaxConcurrent: 4}
	b := setup(t, l, 2) // this replica's share: 50 tokens, 5/s, 2 open
	if _, err := b.local.Reserve(b.snap, est(30), "key:k", ""); err != nil {
		t.Fatal(err)
	}
	_, err := b.local.Reserve(b.snap, est(30), "key:k", "")
	var rej *budget.RejectedError
	if !errors.As(err, &rej) || rej.Limit != budget.LimitTokens || rej.RetryAfter < 2*time.Second || rej.RetryAfter > 2100*time.Millisecond {
		t.Fatalf("over the share: %v", err)
	}
	b.now = b.now.Add(2 * time.Second) // 10 more tokens: exactly 30
	r2, err := b.local.Reserve(b.snap, est(30), "key:k", "")
	if err != nil {
		t.Fatalf("after refill: %v", err)
	}
	// The concurrency share is 2: a third open reservation is refused.
	b.now = b.now.Add(time.Hour)
	if _, err := b.local.Reserve(b.snap, est(1), "key:k", ""); !errors.As(err, &rej) || rej.Limit != budget.LimitConcurrency {
		t.Fatalf("third open reservation: %v", err)
	}
	if err := b.local.End("acme", r2.AdmissionID, true, 5, 5, "key:k"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.local.Reserve(b.snap, est(1), "key:k", ""); err != nil {
		t.Fatalf("after a settle freed a slot: %v", err)
	}
	// Too large for the tenant at all: the same answer as the store's.
	var tl *budget.TooLargeError
	if _, err := b.local.Reserve(b.snap, est(101), "key:k", ""); !errors.As(err, &tl) {
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
	*budget.Store
	left atomic.Int64
}

func (f *failingStore) ReplayReserve(ctx context.Context, p budget.ReplayReserveParams) (bool, error) {
	if f.left.Add(-1) < 0 {
		return false, budget.ErrUnavailable
	}
	return f.Store.ReplayReserve(ctx, p)
}

func TestReplayIsExactlyOnceAcrossInterruptions(t *testing.T) {
	t.Parallel()
	b := setup(t, budget.Limits{TokensCapacity: 1000, TokensRateMicro: budget.Micro}, 1)
	var ids []string
	for range 6 {
		r, err := b.local.Reserve(b.snap, est(10), "key:k", "")
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
	if _, err := b.local.Replay(ctx, fs); !errors.Is(err, budget.ErrUnavailable) {
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
	if err != nil || snap.OpenReservations != 4 || tally.BalanceMicro/budget.Micro != 1000-60+5+10 {
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
