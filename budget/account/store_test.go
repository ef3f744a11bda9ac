package account_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
	"github.com/tokengate/tokengate/integration/pgtest"
	"github.com/tokengate/tokengate/ledger"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

type testBundle struct {
	pool  *pgxpool.Pool
	store *account.Store
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	pool := pgtest.New(t, nil)
	return &testBundle{pool: pool, store: account.NewStore(pool)}
}

// frozen is a clock that moves only when a test says so.
type frozen struct {
	mu  sync.Mutex
	now time.Time
}

func (f *frozen) Now() time.Time { f.mu.Lock(); defer f.mu.Unlock(); return f.now }

func (f *frozen) Advance(d time.Duration) { f.mu.Lock(); defer f.mu.Unlock(); f.now = f.now.Add(d) }

// setupFrozen is setup with the store deciding on a frozen clock instead of
// the database's, so that figures are exact.
func setupFrozen(t *testing.T) (*testBundle, *frozen) {
	t.Helper()
	b := setup(t)
	clock := &frozen{now: time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)}
	b.store.WithClock(clock.Now)
	return b, clock
}

var ctx = context.Background()

func (b *testBundle) tenant(t *testing.T, id string, l rule.Limits) {
	t.Helper()
	if _, err := b.store.CreateTenant(ctx, account.CreateTenantParams{ID: id, Limits: l, Actor: "test"}); err != nil {
		t.Fatal(err)
	}
}

// rewind moves a tenant's stored refill timestamps back by d: the test's way
// of letting time pass without sleeping.
func (b *testBundle) rewind(t *testing.T, id string, d time.Duration) {
	t.Helper()
	_, err := b.pool.Exec(ctx, `UPDATE tenants SET tokens_at = tokens_at - make_interval(secs => $2::float8 / 1e6),
		requests_at = requests_at - make_interval(secs => $2::float8 / 1e6) WHERE id = $1`, id, d.Microseconds())
	if err != nil {
		t.Fatal(err)
	}
}

// fst is the error of a (value, error) pair.
func fst[T any](_ T, err error) error { return err }

func reserve(cost int64) account.ReserveParams {
	return account.ReserveParams{Estimate: estimator.Estimate{Model: "gpt-4o", InputTokens: cost / 2, OutputTokens: cost - cost/2, Cost: cost,
		InputWeightMicro: estimator.WeightOne, OutputWeightMicro: estimator.WeightOne}}
}

func (b *testBundle) reserve(t *testing.T, id string, cost int64) (*account.Reservation, error) {
	t.Helper()
	p := reserve(cost)
	p.TenantID = id
	return b.store.Reserve(ctx, p)
}

func (b *testBundle) mustReserve(t *testing.T, id string, cost int64) *account.Reservation {
	t.Helper()
	r, err := b.reserve(t, id, cost)
	if err != nil {
		t.Fatalf("reserve %d: %v", cost, err)
	}
	return r
}

func rejected(t *testing.T, err error, limit rule.Limit) *rule.RejectedError {
	t.Helper()
	var rej *rule.RejectedError
	if !errors.As(err, &rej) || rej.Limit != limit {
		t.Fatalf("got %v, want a rejection by %s", err, limit)
	}
	return rej
}

// state is everything a rejection must leave untouched.
type state struct {
	row     string
	entries int
}

func (b *testBundle) state(t *testing.T, id string) state {
	t.Helper()
	var s state
	if err := b.pool.QueryRow(ctx, `SELECT row_to_json(t)::text FROM tenants t WHERE id = $1`, id).Scan(&s.row); err != nil {
		t.Fatal(err)
	}
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM ledger_entries WHERE tenant_id = $1`, id).Scan(&s.entries); err != nil {
		t.Fatal(err)
	}
	return s
}

// verify recomputes the tenant's ledger and checks it against the row.
func (b *testBundle) verify(t *testing.T, id string) ledger.Tally {
	t.Helper()
	tally, err := ledger.Verify(ctx, b.pool, id)
	if err != nil {
		t.Fatal(err)
	}
	var stored, seq int64
	if err := b.pool.QueryRow(ctx, `SELECT tokens_micro, ledger_seq FROM tenants WHERE id = $1`, id).Scan(&stored, &seq); err != nil {
		t.Fatal(err)
	}
	if tally.BalanceMicro != stored || tally.LastSeq != seq {
		t.Fatalf("ledger recomputes balance %d at seq %d; the row holds %d at seq %d", tally.BalanceMicro, tally.LastSeq, stored, seq)
	}
	return tally
}

func limits(capacity int64, perSecond string) rule.Limits {
	rate, err := rule.ParseRate(perSecond)
	if err != nil {
		panic(err)
	}
	return rule.Limits{TokensCapacity: capacity, TokensRateMicro: rate}
}

func TestBurstThenRejectionWithExactRetryAfter(t *testing.T) {
	t.Parallel()
	// A frozen clock: at 2 tokens/s, half a second between the reserves
	// on the real clock would refill a token and move the exact 20 below.
	b, _ := setupFrozen(t)
	b.tenant(t, "acme", limits(100, "2"))

	b.mustReserve(t, "acme", 40)
	r := b.mustReserve(t, "acme", 40)
	if got := r.Snapshot.Tokens(); got != 20 {
		t.Fatalf("after 80 of 100: %d tokens left", got)
	}
	before := b.state(t, "acme")
	_, err := b.reserve(t, "acme", 40)
	rej := rejected(t, err, rule.LimitTokens)
	// The deficit at the decision's own clock, refilled at 2 tokens/s,
	// rounded up to the microsecond and then to the millisecond.
	deficit := 40*rule.Micro - rej.Snapshot.TokensMicro
	us := (deficit*rule.Micro + 2*rule.Micro - 1) / (2 * rule.Micro)
	want := (time.Duration(us)*time.Microsecond + time.Millisecond - 1).Truncate(time.Millisecond)
	if rej.RetryAfter != want || rej.RetryAfter < 9*time.Second || rej.RetryAfter > 10*time.Second {
		t.Fatalf("retry after %s, want %s (about 10 s for 20 tokens at 2/s)", rej.RetryAfter, want)
	}
	if after := b.state(t, "acme"); after != before {
		t.Fatalf("a rejection changed state:\nbefore %+v\nafter  %+v", before, after)
	}
	b.verify(t, "acme")
}

func TestRefillOverAFrozenClock(t *testing.T) {
	t.Parallel()
	b, clock := setupFrozen(t)
	b.tenant(t, "acme", limits(1000, "1"))
	b.mustReserve(t, "acme", 1000)
	if _, err := b.reserve(t, "acme", 1); err == nil {
		t.Fatal("empty bucket admitted")
	}
	clock.Advance(300 * time.Second) // 300 tokens
	r := b.mustReserve(t, "acme", 250)
	if got := r.Snapshot.TokensMicro; got != 50*rule.Micro {
		t.Fatalf("after 300 s at 1/s and a 250 debit: %d micro-tokens, want exactly 50 tokens", got)
	}
	clock.Advance(time.Hour) // far more than capacity
	r = b.mustReserve(t, "acme", 1)
	if got := r.Snapshot.Tokens(); got != 999 {
		t.Fatalf("refill must stop at capacity: %d tokens, want 999", got)
	}

	// The ledger recorded each refill exactly: 300 s at 1/s, then exactly
	// what filled the bucket to capacity.
	rows, err := b.pool.Query(ctx, `SELECT refill_micro, balance_micro - delta_micro FROM ledger_entries WHERE tenant_id = 'acme' ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var refills, before []int64
	for rows.Next() {
		var refill, beforeDelta int64
		if err := rows.Scan(&refill, &beforeDelta); err != nil {
			t.Fatal(err)
		}
		refills, before = append(refills, refill), append(before, beforeDelta)
	}
	if len(refills) != 4 || refills[1] != 0 || refills[2] != 300*rule.Micro || refills[3] != 950*rule.Micro || before[3] != 1000*rule.Micro {
		t.Fatalf("recorded refills %v, balances before each debit %v", refills, before)
	}
	b.verify(t, "acme")
}

func TestRequestBucket(t *testing.T) {
	t.Parallel()
	b, clock := setupFrozen(t)
	l := limits(1_000_000, "1000")
	l.RequestsCapacity, l.RequestsRateMicro = 3, rule.Micro/60 // 3 burst, 1 per minute
	b.tenant(t, "acme", l)
	for range 3 {
		b.mustReserve(t, "acme", 1)
	}
	_, err := b.reserve(t, "acme", 1)
	rej := rejected(t, err, rule.LimitRequests)
	// 1/60 per second is 16 666 micro-requests a second: one request
	// refills in ceil(1e12 / 16666) = 60 002 401 us, answered rounded up
	// to the millisecond.
	if rej.RetryAfter != 60003*time.Millisecond {
		t.Fatalf("retry after %s, want exactly 60.003 s", rej.RetryAfter)
	}
	clock.Advance(60_002_400 * time.Microsecond)
	rejected(t, fst(b.reserve(t, "acme", 1)), rule.LimitRequests)
	clock.Advance(time.Microsecond)
	r := b.mustReserve(t, "acme", 1)
	if r.Snapshot.Requests() != 0 {
		t.Fatalf("requests left %d, want 0", r.Snapshot.Requests())
	}
}

func TestConcurrencyLimit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	l := limits(1000, "1")
	l.MaxConcurrent = 2
	b.tenant(t, "acme", l)
	r1 := b.mustReserve(t, "acme", 10)
	b.mustReserve(t, "acme", 10)
	_, err := b.reserve(t, "acme", 10)
	if rej := rejected(t, err, rule.LimitConcurrency); rej.RetryAfter != rule.ConcurrencyRetryHint {
		t.Fatalf("retry after %s", rej.RetryAfter)
	}
	if _, err := b.store.Settle(ctx, account.SettleParams{TenantID: "acme", AdmissionID: r1.AdmissionID, InputTokens: 3, OutputTokens: 2}); err != nil {
		t.Fatal(err)
	}
	b.mustReserve(t, "acme", 10)
}

func TestPeriodBudgetAndReset(t *testing.T) {
	t.Parallel()
	b := setup(t)
	l := limits(10_000, "1000")
	l.PeriodBudget, l.Period = 100, rule.PeriodDay
	b.tenant(t, "acme", l)
	b.mustReserve(t, "acme", 60)
	r := b.mustReserve(t, "acme", 40)
	if r.Snapshot.PeriodRemaining() != 0 {
		t.Fatalf("period remaining %d", r.Snapshot.PeriodRemaining())
	}
	_, err := b.reserve(t, "acme", 1)
	rej := rejected(t, err, rule.LimitPeriodBudget)
	if want := rej.Snapshot.PeriodEnd.Sub(rej.Snapshot.At); rej.RetryAfter < want || rej.RetryAfter > want+time.Millisecond {
		t.Fatalf("retry after %s, want the time to the next UTC midnight, %s", rej.RetryAfter, want)
	}
	if !rej.Snapshot.PeriodEnd.Equal(rej.Snapshot.PeriodStart.AddDate(0, 0, 1)) || rej.Snapshot.PeriodStart.Hour() != 0 {
		t.Fatalf("window %s .. %s is not a UTC day", rej.Snapshot.PeriodStart, rej.Snapshot.PeriodEnd)
	}
	// Yesterday's window: the stored period start moves back a day.
	if _, err := b.pool.Exec(ctx, `UPDATE tenants SET window_usage = jsonb_build_array(jsonb_set(window_usage->0, '{start}',
		to_jsonb((window_usage->0->>'start')::timestamptz - interval '1 day'))) WHERE id = 'acme'`); err != nil {
		t.Fatal(err)
	}
	r = b.mustReserve(t, "acme", 100)
	if r.Snapshot.PeriodUsed != 100 || !r.Snapshot.PeriodStart.Equal(rej.Snapshot.PeriodStart) {
		t.Fatalf("after the reset: used %d in window %s", r.Snapshot.PeriodUsed, r.Snapshot.PeriodStart)
	}
	b.verify(t, "acme")
}

func TestTooLarge(t *testing.T) {
	t.Parallel()
	b := setup(t)
	l := limits(100, "1")
	l.PeriodBudget, l.Period = 50, rule.PeriodMonth
	b.tenant(t, "acme", l)
	before := b.state(t, "acme")
	for _, tc := range []struct {
		cost  int64
		limit rule.Limit
	}{{101, rule.LimitTokens}, {51, rule.LimitPeriodBudget}} {
		_, err := b.reserve(t, "acme", tc.cost)
		var tl *rule.TooLargeError
		if !errors.As(err, &tl) || tl.Limit != tc.limit {
			t.Fatalf("cost %d: %v, want too large for %s", tc.cost, err, tc.limit)
		}
	}
	if after := b.state(t, "acme"); after != before {
		t.Fatal("a too-large request changed state")
	}
}

func TestIdempotentRetryDebitsOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.tenant(t, "acme", limits(100, "1"))
	p := reserve(30)
	p.TenantID, p.IdempotencyKey, p.RequestHash = "acme", "retry-1", []byte("hash-a")
	first, err := b.store.Reserve(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	again, err := b.store.Reserve(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if again.AdmissionID != first.AdmissionID || !again.Replayed || again.Snapshot.TokensMicro != first.Snapshot.TokensMicro {
		t.Fatalf("retry returned %+v, want the original %+v", again, first)
	}
	p.RequestHash = []byte("hash-b")
	if _, err := b.store.Reserve(ctx, p); !errors.Is(err, rule.ErrIdempotencyMismatch) {
		t.Fatalf("key reused for another request: %v", err)
	}
	if tally := b.verify(t, "acme"); tally.Entries != 2 || tally.BalanceMicro != 70*rule.Micro {
		t.Fatalf("ledger has %d entries, balance %d; want one debit", tally.Entries, tally.BalanceMicro)
	}
	// After 24 h the key is forgotten: a retry is a fresh attempt.
	if _, err := b.pool.Exec(ctx, `UPDATE idempotency_keys SET created_at = created_at - interval '25 hours'`); err != nil {
		t.Fatal(err)
	}
	p.RequestHash = []byte("hash-a")
	fresh, err := b.store.Reserve(ctx, p)
	if err != nil || fresh.AdmissionID == first.AdmissionID || fresh.Replayed {
		t.Fatalf("after 24 h: %+v, %v; want a new admission", fresh, err)
	}
	// A rejected request is not remembered: its retry is a fresh attempt.
	p2 := reserve(90)
	p2.TenantID, p2.IdempotencyKey, p2.RequestHash = "acme", "retry-2", []byte("h")
	if _, err := b.store.Reserve(ctx, p2); !errors.Is(err, rule.ErrRejected) {
		t.Fatalf("want rejection, got %v", err)
	}
	b.rewind(t, "acme", time.Minute)
	if r, err := b.store.Reserve(ctx, p2); err != nil || r.Replayed {
		t.Fatalf("retry of a rejected request: %+v %v", r, err)
	}
}

// A key kept with ReplayNow (the rate limit service's request id) stores
// no answer: its retry is the same admission, debited once, with the
// balances as they are at the retry; another request under the key is
// still refused; and the key still names its admission for a settle.
func TestReplayNowRetryDebitsOnceAndAnswersTheBalancesNow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// A slow refill: the real clock runs between the reserves, and the
	// check below allows 5 tokens of it, which 1/s would give in 5 s.
	b.tenant(t, "acme", limits(100, "0.001"))
	p := reserve(30)
	p.TenantID, p.IdempotencyKey, p.RequestHash, p.ReplayNow = "acme", "req-1", []byte("hash-a"), true
	first, err := b.store.Reserve(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	var stored int
	if err := b.pool.QueryRow(ctx, `SELECT length(response) FROM idempotency_keys WHERE key = 'req-1'`).Scan(&stored); err != nil || stored != 0 {
		t.Fatalf("stored answer of %d bytes (%v), want none", stored, err)
	}
	other := reserve(20)
	other.TenantID = "acme"
	if _, err := b.store.Reserve(ctx, other); err != nil {
		t.Fatal(err)
	}
	again, err := b.store.Reserve(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	// 70 tokens were left after it, 50 after the other (and a little refill).
	if left := again.Snapshot.TokensMicro; again.AdmissionID != first.AdmissionID || !again.Replayed || left < 50*rule.Micro || left > 55*rule.Micro {
		t.Fatalf("retry = %+v, want admission %s replayed with 50 tokens left", again, first.AdmissionID)
	}
	p.RequestHash = []byte("hash-b")
	if _, err := b.store.Reserve(ctx, p); !errors.Is(err, rule.ErrIdempotencyMismatch) {
		t.Fatalf("key reused for another request: %v", err)
	}
	st, err := b.store.Settle(ctx, account.SettleParams{TenantID: "acme", IdempotencyKey: "req-1", InputTokens: 10})
	if err != nil || st.Admission.ID != first.AdmissionID {
		t.Fatalf("settle by key: %+v, %v", st, err)
	}
	if tally := b.verify(t, "acme"); tally.Entries != 4 {
		t.Fatalf("ledger has %d entries, want the tenant's, two debits and a settle", tally.Entries)
	}
}

func TestSettleRefundExtraChargeAndDebt(t *testing.T) {
	t.Parallel()
	// A frozen clock: the rewind below lets exactly the debt plus 10 s pass;
	// on the real clock, 2 s more between the settle and the last reserve
	// would leave more than the 6 tokens it allows.
	b, _ := setupFrozen(t)
	b.tenant(t, "acme", limits(100, "1"))

	// Refund: estimate 60, actual 25.
	r := b.mustReserve(t, "acme", 60)
	s, err := b.store.Settle(ctx, account.SettleParams{TenantID: "acme", AdmissionID: r.AdmissionID, InputTokens: 20, OutputTokens: 5})
	if err != nil {
		t.Fatal(err)
	}
	if s.DeltaMicro != 35*rule.Micro || *s.Admission.ActualCost != 25 || s.Admission.State != account.StateSettled {
		t.Fatalf("refund settle: %+v", s)
	}
	// The same settle again: the same answer, no new entry.
	entries := b.state(t, "acme").entries
	s2, err := b.store.Settle(ctx, account.SettleParams{TenantID: "acme", AdmissionID: r.AdmissionID, InputTokens: 20, OutputTokens: 5})
	if err != nil || !s2.Replayed || s2.DeltaMicro != s.DeltaMicro || s2.BalanceMicro != s.BalanceMicro {
		t.Fatalf("repeated settle: %+v %v", s2, err)
	}
	if b.state(t, "acme").entries != entries {
		t.Fatal("a repeated settle wrote an entry")
	}
	// Different usage: conflict.
	if _, err := b.store.Settle(ctx, account.SettleParams{TenantID: "acme", AdmissionID: r.AdmissionID, InputTokens: 21, OutputTokens: 5}); !errors.Is(err, rule.ErrConflict) {
		t.Fatalf("different usage: %v", err)
	}

	// Extra charge that drives the balance negative: estimate 70, actual 150.
	r = b.mustReserve(t, "acme", 70)
	s, err = b.store.Settle(ctx, account.SettleParams{TenantID: "acme", AdmissionID: r.AdmissionID, InputTokens: 115, OutputTokens: 35})
	if err != nil {
		t.Fatal(err)
	}
	if s.DeltaMicro != -80*rule.Micro || s.BalanceMicro >= 0 {
		t.Fatalf("extra charge: delta %d balance %d, want -80e6 and a debt", s.DeltaMicro, s.BalanceMicro)
	}
	debt := s.BalanceMicro
	if _, err := b.reserve(t, "acme", 1); !errors.Is(err, rule.ErrRejected) {
		t.Fatalf("a tenant in debt was admitted: %v", err)
	}
	// Refill pays the debt back: after enough time the tenant is admitted.
	b.rewind(t, "acme", time.Duration(-debt/rule.Micro+10)*time.Second)
	r = b.mustReserve(t, "acme", 5)
	if got := r.Snapshot.Tokens(); got < 4 || got > 6 {
		t.Fatalf("after paying back the debt: %d tokens, want about 5", got)
	}
	b.verify(t, "acme")
}

func TestRefundCappedAtCapacity(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.tenant(t, "acme", limits(100, "1"))
	r := b.mustReserve(t, "acme", 50)
	b.rewind(t, "acme", time.Hour) // refill back to capacity while reserved
	s, err := b.store.Release(ctx, account.ReleaseParams{TenantID: "acme", AdmissionID: r.AdmissionID})
	if err != nil {
		t.Fatal(err)
	}
	if s.DeltaMicro != 0 || s.BalanceMicro != 100*rule.Micro {
		t.Fatalf("release at capacity: delta %d balance %d, want 0 and capacity", s.DeltaMicro, s.BalanceMicro)
	}
	b.verify(t, "acme")
}

func TestReleaseThenSettleConflicts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.tenant(t, "acme", limits(1000, "0.001"))
	b.mustReserve(t, "acme", 500) // room below capacity, so the refund is not capped
	r := b.mustReserve(t, "acme", 60)
	s, err := b.store.Release(ctx, account.ReleaseParams{TenantID: "acme", AdmissionID: r.AdmissionID})
	if err != nil {
		t.Fatal(err)
	}
	if s.DeltaMicro != 60*rule.Micro || s.Admission.State != account.StateReleased {
		t.Fatalf("release: %+v", s)
	}
	again, err := b.store.Release(ctx, account.ReleaseParams{TenantID: "acme", AdmissionID: r.AdmissionID})
	if err != nil || !again.Replayed || again.DeltaMicro != s.DeltaMicro {
		t.Fatalf("repeated release: %+v %v", again, err)
	}
	if _, err := b.store.Settle(ctx, account.SettleParams{TenantID: "acme", AdmissionID: r.AdmissionID, InputTokens: 1, OutputTokens: 1}); !errors.Is(err, rule.ErrConflict) {
		t.Fatalf("settle after release: %v", err)
	}
	// Settled admissions cannot be released either.
	r = b.mustReserve(t, "acme", 10)
	if _, err := b.store.Settle(ctx, account.SettleParams{TenantID: "acme", AdmissionID: r.AdmissionID, InputTokens: 1, OutputTokens: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Release(ctx, account.ReleaseParams{TenantID: "acme", AdmissionID: r.AdmissionID}); !errors.Is(err, rule.ErrConflict) {
		t.Fatalf("release after settle: %v", err)
	}
}

func TestExpiryBySweeperAndLateSettle(t *testing.T) {
	t.Parallel()
	b := setup(t)
	l := limits(100, "0.001")
	l.MaxConcurrent = 1
	b.tenant(t, "acme", l)
	r := b.mustReserve(t, "acme", 40)
	if _, err := b.reserve(t, "acme", 1); !errors.Is(err, rule.ErrRejected) {
		t.Fatal("slot should be taken")
	}
	if n, err := b.store.SweepOnce(ctx, nil); err != nil || n != 0 {
		t.Fatalf("sweep before expiry expired %d (%v)", n, err)
	}
	if _, err := b.pool.Exec(ctx, `UPDATE admissions SET expires_at = clock_timestamp() - interval '1 second' WHERE id = $1`, r.AdmissionID); err != nil {
		t.Fatal(err)
	}
	if n, err := b.store.SweepOnce(ctx, nil); err != nil || n != 1 {
		t.Fatalf("sweep expired %d (%v), want 1", n, err)
	}
	a, err := b.store.AdmissionGet(ctx, "acme", r.AdmissionID)
	if err != nil || a.State != account.StateExpired {
		t.Fatalf("after sweep: %+v %v", a, err)
	}
	// Charged at the estimate, slot freed.
	snap, err := b.store.TenantSnapshot(ctx, "acme")
	if err != nil || snap.OpenReservations != 0 || snap.Tokens() != 60 {
		t.Fatalf("after expiry: open %d tokens %d (%v)", snap.OpenReservations, snap.Tokens(), err)
	}
	r2 := b.mustReserve(t, "acme", 1)

	// A late settle still reconciles against the estimate expiry charged.
	s, err := b.store.Settle(ctx, account.SettleParams{TenantID: "acme", AdmissionID: r.AdmissionID, InputTokens: 10, OutputTokens: 10})
	if err != nil || s.Admission.State != account.StateSettled || !s.Admission.Late || s.DeltaMicro != 20*rule.Micro {
		t.Fatalf("late settle: %+v %v", s, err)
	}
	snap, _ = b.store.TenantSnapshot(ctx, "acme")
	if snap.OpenReservations != 1 {
		t.Fatalf("a late settle must not free a slot twice: open %d", snap.OpenReservations)
	}
	var late bool
	if err := b.pool.QueryRow(ctx, `SELECT late FROM ledger_entries WHERE admission_id = $1 AND kind = 'settle'`, r.AdmissionID).Scan(&late); err != nil || !late {
		t.Fatalf("ledger does not mark the settle late (%v)", err)
	}
	_ = r2
	b.verify(t, "acme")
}

func TestOtherTenantsAdmissionIsNotFound(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.tenant(t, "acme", limits(100, "1"))
	b.tenant(t, "globex", limits(100, "1"))
	r := b.mustReserve(t, "acme", 10)
	if _, err := b.store.AdmissionGet(ctx, "globex", r.AdmissionID); !errors.Is(err, rule.ErrAdmissionNotFound) {
		t.Fatalf("get: %v", err)
	}
	if _, err := b.store.Settle(ctx, account.SettleParams{TenantID: "globex", AdmissionID: r.AdmissionID}); !errors.Is(err, rule.ErrAdmissionNotFound) {
		t.Fatalf("settle: %v", err)
	}
	if _, err := b.store.Release(ctx, account.ReleaseParams{TenantID: "globex", AdmissionID: r.AdmissionID}); !errors.Is(err, rule.ErrAdmissionNotFound) {
		t.Fatalf("release: %v", err)
	}
	if _, err := b.reserve(t, "nobody", 1); !errors.Is(err, rule.ErrTenantNotFound) {
		t.Fatalf("unknown tenant: %v", err)
	}
}

func TestLedgerIsAppendOnly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.tenant(t, "acme", limits(100, "1"))
	for _, stmt := range []string{
		`UPDATE ledger_rows SET delta_micro = 0`,
		`DELETE FROM ledger_rows`,
		`TRUNCATE ledger_rows`,
	} {
		if _, err := b.pool.Exec(ctx, stmt); err == nil {
			t.Fatalf("%s succeeded", stmt)
		}
	}
	b.verify(t, "acme")
}

func TestDecideReservesInOrderUnderOneLock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.tenant(t, "acme", limits(100, "0.001"))
	p := func(cost int64, key string) account.Op {
		r := reserve(cost)
		r.TenantID, r.IdempotencyKey, r.RequestHash = "acme", key, []byte("h"+key)
		return account.Op{Reserve: &r}
	}
	res, err := b.store.Decide(ctx, "acme", []account.Op{
		p(30, ""), p(30, ""), p(50, ""), p(10, "k"), p(10, "k"), p(200, ""), p(20, ""),
	})
	if err != nil {
		t.Fatal(err)
	}
	var rej *rule.RejectedError
	var tl *rule.TooLargeError
	switch {
	case res[0].Err != nil || res[1].Err != nil:
		t.Fatalf("the first two fit: %v %v", res[0].Err, res[1].Err)
	case !errors.As(res[2].Err, &rej) || rej.Limit != rule.LimitTokens:
		t.Fatalf("50 after 60 of 100: %v", res[2].Err)
	case res[3].Err != nil || res[4].Err != nil || res[4].Reservation.AdmissionID != res[3].Reservation.AdmissionID || !res[4].Reservation.Replayed:
		t.Fatalf("the same key twice in one batch: %+v %+v", res[3], res[4])
	case !errors.As(res[5].Err, &tl):
		t.Fatalf("200 of 100: %v", res[5].Err)
	case res[6].Err != nil || res[6].Reservation.Snapshot.Tokens() != 10:
		t.Fatalf("the last 20: %+v", res[6])
	}
	// Rejections carry the balances after the whole batch.
	if rej.Snapshot.Tokens() != 10 {
		t.Fatalf("rejection snapshot holds %d tokens", rej.Snapshot.Tokens())
	}
	if tally := b.verify(t, "acme"); tally.Entries != 1+4 {
		t.Fatalf("%d ledger entries, want the creation and 4 reserves", tally.Entries)
	}
}

// TestDecideMixesReservesSettlesAndReleases: one batch settles, releases,
// reserves with the balance those left, replays a repeated settle, refuses
// conflicting and unknown ones, and writes one entry per change.
func TestDecideMixesReservesSettlesAndReleases(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.tenant(t, "acme", limits(100, "0.001"))
	first, err := b.store.Decide(ctx, "acme", []account.Op{{Reserve: ptr(reserveFor("acme", 40))}, {Reserve: ptr(reserveFor("acme", 40))}})
	if err != nil || first[0].Err != nil || first[1].Err != nil {
		t.Fatalf("%v %+v", err, first)
	}
	a1, a2 := first[0].Reservation.AdmissionID, first[1].Reservation.AdmissionID
	settle := func(id string, in, out int64) account.Op {
		return account.Op{Settle: &account.SettleParams{TenantID: "acme", AdmissionID: id, InputTokens: in, OutputTokens: out}}
	}
	res, err := b.store.Decide(ctx, "acme", []account.Op{
		{Reserve: ptr(reserveFor("acme", 50))}, // 0: 20 left: refused
		settle(a1, 5, 5),                       // 1: refunds 30: 50 left
		{Reserve: ptr(reserveFor("acme", 50))}, // 2: fits now: 0 left
		settle(a1, 5, 5),                       // 3: the same settle again: replayed
		settle(a1, 6, 5),                       // 4: different usage: conflict
		{Release: &account.ReleaseParams{TenantID: "acme", AdmissionID: a2}},      // 5: refunds 40
		{Release: &account.ReleaseParams{TenantID: "acme", AdmissionID: "adm_x"}}, // 6: unknown
		settle(a2, 1, 1), // 7: settled after release: conflict
	})
	if err != nil {
		t.Fatal(err)
	}
	var rej *rule.RejectedError
	switch {
	case !errors.As(res[0].Err, &rej) || rej.Limit != rule.LimitTokens:
		t.Fatalf("50 of 20: %+v", res[0])
	case res[1].Err != nil || res[1].Settlement.DeltaMicro != 30*rule.Micro || res[1].Settlement.Replayed:
		t.Fatalf("settle: %+v", res[1])
	case res[2].Err != nil || res[2].Reservation.Snapshot.Tokens() != 0:
		t.Fatalf("the reserve after the refund: %+v", res[2])
	case res[3].Err != nil || !res[3].Settlement.Replayed || res[3].Settlement.DeltaMicro != 30*rule.Micro:
		t.Fatalf("repeated settle: %+v", res[3])
	case !errors.Is(res[4].Err, rule.ErrConflict):
		t.Fatalf("conflicting settle: %+v", res[4])
	case res[5].Err != nil || res[5].Settlement.DeltaMicro != 40*rule.Micro || res[5].Settlement.Snapshot.Tokens() != 40:
		t.Fatalf("release: %+v", res[5])
	case !errors.Is(res[6].Err, rule.ErrAdmissionNotFound):
		t.Fatalf("unknown admission: %+v", res[6])
	case !errors.Is(res[7].Err, rule.ErrConflict):
		t.Fatalf("settle after release: %+v", res[7])
	}
	a, err := b.store.AdmissionGet(ctx, "acme", a1)
	if err != nil || a.State != account.StateSettled || *a.ActualCost != 10 {
		t.Fatalf("%v %+v", err, a)
	}
	if tally := b.verify(t, "acme"); tally.Entries != 1+2+3 || tally.BalanceMicro/rule.Micro != 40 {
		t.Fatalf("%d entries, balance %d: want creation, 2 reserves, then settle, reserve, release; 40 tokens", tally.Entries, tally.BalanceMicro)
	}
}

func reserveFor(tenantID string, cost int64) account.ReserveParams {
	r := reserve(cost)
	r.TenantID = tenantID
	return r
}

func ptr[T any](v T) *T { return &v }

// fit moves the output beyond what e reserved into the input, so that a
// test's usage stays within the bound a settle checks (account.SettleBounds)
// and costs the same at weight 1.0.
func fit(e estimator.Estimate, in, out int64) (int64, int64) {
	if out > e.OutputTokens {
		in, out = in+out-e.OutputTokens, e.OutputTokens
	}
	return in, out
}
