package replica_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/admission"
	"github.com/tokengate/tokengate/budget/lease"
	"github.com/tokengate/tokengate/budget/replica"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
	"github.com/tokengate/tokengate/integration/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

const (
	tok      = rule.Micro
	leaseTTL = 10 * time.Second
	minSlice = 100 // tokens
)

// leaseBundle is replicas on one database, on one frozen clock (the
// holders' and the store's), with no background top-up loop: a test
// calls TopUpOnce where the loop would run.
type leaseBundle struct {
	url  string
	now  *atomic.Int64
	reps []*replica.Replica
	pool *pgxpool.Pool // the first replica's
	// minSlice is the replicas' minimum slice, in tokens.
	minSlice int64
}

func (b *leaseBundle) clock() time.Time { return time.Unix(0, b.now.Load()).UTC() }

func (b *leaseBundle) advance(d time.Duration) { b.now.Add(int64(d)) }

func setupLeases(t *testing.T, replicas int) *leaseBundle {
	t.Helper()
	return setupLeasesSlice(t, replicas, minSlice)
}

// setupLeasesSlice is setupLeases with a minimum slice of its own, in
// tokens.
func setupLeasesSlice(t *testing.T, replicas int, slice int64) *leaseBundle {
	t.Helper()
	b := &leaseBundle{url: pgtest.URL(t), now: &atomic.Int64{}, minSlice: slice}
	b.now.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	for i := range replicas {
		r, _ := b.replica(t, string(rune('a'+i)))
		b.reps = append(b.reps, r)
	}
	return b
}

// replica starts a replica on the bundle's database and returns it with
// what stops its leasing's Run (the test's end does too).
func (b *leaseBundle) replica(t *testing.T, name string) (*replica.Replica, func()) {
	t.Helper()
	pool := pgtest.Pool(t, b.url, func(c *pgxpool.Config) { c.MaxConns = 8 })
	if b.pool == nil {
		b.pool = pool
	}
	r, err := replica.New(replica.Config{DB: pool, Store: account.NewStore(pool).WithClock(b.clock),
		Leasing: replica.LeaseConfig{Holder: name, TTL: leaseTTL, MinSlice: b.minSlice, Tick: -1, NowFunc: b.clock, ClockFunc: b.clock}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Leases.Run(ctx); close(done) }()
	stop := func() { cancel(); <-done }
	t.Cleanup(func() { stop(); r.Close() })
	return r, stop
}

func (b *leaseBundle) tenant(t *testing.T, id string, l rule.Limits, mode lease.Mode) {
	t.Helper()
	ctx := context.Background()
	if _, err := b.reps[0].Store.CreateTenant(ctx, account.CreateTenantParams{ID: id, Limits: l}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.reps[0].Admin.TenantLeaseModeSet(ctx, lease.SetModeParams{TenantID: id, Mode: mode}); err != nil {
		t.Fatal(err)
	}
}

func (b *leaseBundle) balance(t *testing.T, id string) int64 {
	t.Helper()
	var v int64
	if err := b.pool.QueryRow(context.Background(), "SELECT tokens_micro FROM tenants WHERE id = $1", id).Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// leases counts the tenant's lease rows, and its lease_take entries.
func (b *leaseBundle) leases(t *testing.T, id string) (rows, takes int) {
	t.Helper()
	ctx := context.Background()
	if err := b.pool.QueryRow(ctx, "SELECT count(*) FROM leases WHERE tenant_id = $1", id).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if err := b.pool.QueryRow(ctx, "SELECT count(*) FROM ledger_entries WHERE tenant_id = $1 AND kind = 'lease_take'", id).Scan(&takes); err != nil {
		t.Fatal(err)
	}
	return rows, takes
}

func req(tenant string, cost int64) admission.Request {
	return admission.Request{Face: admission.FaceAPI, ReserveParams: account.ReserveParams{TenantID: tenant, Estimate: estimator.Estimate{
		Model: "gpt-4o", InputTokens: cost / 2, OutputTokens: cost - cost/2, Cost: cost,
		InputWeightMicro: estimator.WeightOne, OutputWeightMicro: estimator.WeightOne}}}
}

// journalGroups reads tokengate_lease_journal_groups_total{way} off the
// replica's registry.
func journalGroups(t *testing.T, r *replica.Replica, way string) float64 {
	t.Helper()
	mfs, err := r.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "tokengate_lease_journal_groups_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "way" && l.GetValue() == way {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no tokengate_lease_journal_groups_total{way=%q}", way)
	return 0
}

func paths(r *replica.Replica, path string) int {
	return int(testutil.ToFloat64(r.Admitter.Paths(admission.FaceAPI, path)))
}

// leasedTenant is one replica, with a tenant acme of limits l in mode
// auto whose lease the replica holds (warmed with a first, exact,
// admission of warm tokens).
func leasedTenant(t *testing.T, l rule.Limits, warm int64) (*leaseBundle, *replica.Replica) {
	t.Helper()
	b := setupLeases(t, 1)
	b.tenant(t, "acme", l, lease.ModeAuto)
	b.warm(t, "acme", warm)
	return b, b.reps[0]
}

// leaseReserve reserves q through r's admission use case and fails unless
// r's lease admitted it (not replayed), as its nth lease admission.
func leaseReserve(t *testing.T, r *replica.Replica, q admission.Request, nth int) *account.Reservation {
	t.Helper()
	res, _, err := r.Admitter.Reserve(context.Background(), q)
	if err != nil {
		t.Fatal(err)
	}
	if got := paths(r, admission.PathLease); got != nth || res.Replayed {
		t.Fatalf("%d lease admissions (replayed %v), want the request leased (lease admission %d)", got, res.Replayed, nth)
	}
	return res
}

// warm makes each replica's first admission of the tenant (exact: no
// lease is held yet, and the admission wakes the top-up) and runs the
// top-up that takes the lease.
func (b *leaseBundle) warm(t *testing.T, tenant string, cost int64) int64 {
	t.Helper()
	var admitted int64
	for _, r := range b.reps {
		if _, _, err := r.Admitter.Reserve(context.Background(), req(tenant, cost)); err != nil {
			t.Fatal(err)
		}
		admitted += cost
		r.Leases.TopUpOnce(context.Background())
	}
	return admitted
}

// Many goroutines on two replicas admit from one tenant in lease mode,
// while each replica's top-up runs: the tokens admitted never pass the
// budget, both replicas admit from their leases, and once every caller
// was refused, what was admitted is exactly the capacity less the balance
// and the leases' unused parts (no token lost or made).
func TestLeaseTwoReplicasExactBound(t *testing.T) {
	t.Parallel()
	b := setupLeases(t, 2)
	const capacity = 5000
	b.tenant(t, "acme", rule.Limits{TokensCapacity: capacity, TokensRateMicro: tok}, lease.ModeAuto)
	var admitted atomic.Int64
	admitted.Add(b.warm(t, "acme", 5))
	for i, r := range b.reps {
		if st := replica.HolderState(r.Leases, "acme"); st.LeaseID == "" {
			t.Fatalf("replica %d holds no lease after its top-up: %+v", i, st)
		}
	}

	ctx := context.Background()
	stop := make(chan struct{})
	var toppers sync.WaitGroup
	for _, r := range b.reps {
		toppers.Add(1)
		go func() {
			defer toppers.Done()
			for {
				select {
				case <-stop:
					return
				default:
					r.Leases.TopUpOnce(ctx)
				}
			}
		}()
	}
	var wg sync.WaitGroup
	for g := range 16 {
		r := b.reps[g%2]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				cost := int64(1 + (g+i)%9)
				_, _, err := r.Admitter.Reserve(ctx, req("acme", cost))
				if err != nil {
					if !errors.Is(err, rule.ErrRejected) {
						t.Errorf("reserve: %v", err)
					}
					return
				}
				admitted.Add(cost)
			}
		}()
	}
	wg.Wait()
	close(stop)
	toppers.Wait()

	got := admitted.Load()
	if got > capacity {
		t.Fatalf("admitted %d tokens of a budget of %d", got, capacity)
	}
	out, err := b.reps[0].Leases.Store().Outstanding(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if held := capacity*tok - b.balance(t, "acme") - out; held != got*tok {
		t.Fatalf("capacity - balance - unused leases = %d micro-tokens, admitted %d", held, got*tok)
	}
	for i, r := range b.reps {
		if paths(r, admission.PathLease) == 0 {
			t.Errorf("replica %d admitted nothing from its lease", i)
		}
		// Its journal committed groups in one round trip, as the metric says.
		if once := journalGroups(t, r, "one_round_trip"); once == 0 {
			t.Errorf("replica %d: no journal group committed in one round trip (two: %v)", i, journalGroups(t, r, "two_round_trips"))
		}
	}
	t.Logf("admitted %d of %d; unused in leases %d tokens; lease/exact paths %d/%d and %d/%d", got, capacity, out/tok,
		paths(b.reps[0], admission.PathLease), paths(b.reps[0], admission.PathExact), paths(b.reps[1], admission.PathLease), paths(b.reps[1], admission.PathExact))
}

// A tenant in mode off, one whose tree has a rule only exact mode keeps,
// and a request with an Idempotency-Key are decided exactly: no lease is
// ever taken for them, whatever the top-up does.
func TestLeaseExactOnly(t *testing.T) {
	t.Parallel()
	b := setupLeases(t, 1)
	r := b.reps[0]
	ctx := context.Background()
	b.tenant(t, "off", rule.Limits{TokensCapacity: 1000, TokensRateMicro: tok}, lease.ModeOff)
	b.tenant(t, "rpm", rule.Limits{TokensCapacity: 1000, TokensRateMicro: tok, RequestsCapacity: 100, RequestsRateMicro: tok}, lease.ModeAuto)
	for range 3 {
		for _, id := range []string{"off", "rpm"} {
			if _, _, err := r.Admitter.Reserve(ctx, req(id, 3)); err != nil {
				t.Fatal(err)
			}
		}
		r.Leases.TopUpOnce(ctx)
	}
	if got := paths(r, admission.PathLease); got != 0 {
		t.Fatalf("%d admissions from a lease, want none", got)
	}
	if got := paths(r, admission.PathExact); got != 6 {
		t.Fatalf("%d exact admissions, want 6", got)
	}
	for _, id := range []string{"off", "rpm"} {
		if rows, takes := b.leases(t, id); rows != 0 || takes != 0 {
			t.Errorf("%s: %d leases and %d lease_take entries, want none", id, rows, takes)
		}
	}
}

// What the lease cannot decide goes to the exact pipeline: a request
// larger than the lease and the balance together is refused by an exact
// decision (a refusal always is), and while the lease's journal cannot
// commit (stopped), the requests a lease would take are admitted exactly.
func TestLeaseFallsBackToExact(t *testing.T) {
	t.Parallel()
	b, r := leasedTenant(t, rule.Limits{TokensCapacity: 1000, TokensRateMicro: tok}, 10)
	ctx := context.Background()
	leaseReserve(t, r, req("acme", 10), 1)
	_, _, err := r.Admitter.Reserve(ctx, req("acme", 995))
	var rej *rule.RejectedError
	if !errors.As(err, &rej) || rej.Snapshot.TenantID != "acme" {
		t.Fatalf("a request above the budget: %v, want an exact refusal", err)
	}
	if got := paths(r, admission.PathExact); got != 2 { // the warm-up's and the refusal
		t.Fatalf("%d exact decisions, want 2", got)
	}

	// A second replica's journal is stopped: its lease cannot journal, and
	// the exact pipeline admits.
	b.tenant(t, "beta", rule.Limits{TokensCapacity: 1000, TokensRateMicro: tok}, lease.ModeAuto)
	c, stopC := b.replica(t, "c")
	if _, _, err := c.Admitter.Reserve(ctx, req("beta", 10)); err != nil {
		t.Fatal(err)
	}
	stopC()                 // its journal stops (and its leases are given back)
	c.Leases.TopUpOnce(ctx) // takes a lease, which cannot journal
	if st := replica.HolderState(c.Leases, "beta"); st.LeaseID == "" {
		t.Fatal("no lease taken")
	}
	for range 3 {
		if _, _, err := c.Admitter.Reserve(ctx, req("beta", 10)); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := paths(c, admission.PathExact), 4; got != want || paths(c, admission.PathLease) != 0 {
		t.Fatalf("exact %d, lease %d: want %d exact and none from the lease", got, paths(c, admission.PathLease), want)
	}
}

// A lease admission carries its key: once the key is revoked, its requests
// are refused (by the journal, then by the exact decision they fall back
// to) as exact mode refuses them, while another key's are still leased.
func TestLeaseRevokedKey(t *testing.T) {
	t.Parallel()
	b := setupLeases(t, 1)
	r := b.reps[0]
	ctx := context.Background()
	b.tenant(t, "acme", rule.Limits{TokensCapacity: 10_000, TokensRateMicro: tok}, lease.ModeAuto)
	k1, _, err := r.Admin.KeyCreate(ctx, "acme", nil, "test")
	if err != nil {
		t.Fatal(err)
	}
	k2, _, err := r.Admin.KeyCreate(ctx, "acme", nil, "test")
	if err != nil {
		t.Fatal(err)
	}
	keyed := func(k string) admission.Request {
		q := req("acme", 5)
		q.KeyID = k
		return q
	}
	if _, _, err := r.Admitter.Reserve(ctx, keyed(k1.ID)); err != nil {
		t.Fatal(err)
	}
	r.Leases.TopUpOnce(ctx)
	if _, _, err := r.Admitter.Reserve(ctx, keyed(k1.ID)); err != nil {
		t.Fatal(err)
	}
	if got := paths(r, admission.PathLease); got != 1 {
		t.Fatalf("%d lease admissions, want 1", got)
	}
	if err := r.Admin.KeyRevoke(ctx, "acme", k1.ID, "test"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := r.Admitter.Reserve(ctx, keyed(k1.ID)); !errors.Is(err, rule.ErrKeyRevoked) {
		t.Fatalf("a revoked key's request: %v, want ErrKeyRevoked", err)
	}
	if _, _, err := r.Admitter.Reserve(ctx, keyed(k2.ID)); err != nil {
		t.Fatal(err)
	}
	if got := paths(r, admission.PathLease); got != 2 {
		t.Fatalf("%d lease admissions, want 2 (the other key's)", got)
	}
}

// A lease admission made through the admission use case is settled by its
// id like an exact one (its lease is booked first): the settle refunds
// what the usage did not take, once.
func TestLeaseAdmissionSettles(t *testing.T) {
	t.Parallel()
	_, r := leasedTenant(t, rule.Limits{TokensCapacity: 10_000, TokensRateMicro: 1}, 5)
	ctx := context.Background()
	res := leaseReserve(t, r, req("acme", 40), 1)
	st, _, err := r.Admitter.Settle(ctx, admission.FaceAPI, account.SettleParams{TenantID: "acme", AdmissionID: res.AdmissionID, InputTokens: 10, OutputTokens: 0})
	if err != nil {
		t.Fatalf("settle of a lease admission: %v", err)
	}
	if st.DeltaMicro != 30*tok || st.Admission == nil || st.Admission.ID != res.AdmissionID {
		t.Fatalf("settle %+v: want a refund of 30 tokens", st)
	}
	// Settled in the lease's journal: the admission is in the lease's order.
	var ended bool
	if err := r.Store.Pool().QueryRow(ctx, "SELECT lease_end_seq IS NOT NULL FROM admissions WHERE id = $1", res.AdmissionID).Scan(&ended); err != nil || !ended {
		t.Fatalf("the lease admission's settle was not made in the lease's journal (%v)", err)
	}
	if _, _, err := r.Admitter.Settle(ctx, admission.FaceAPI, account.SettleParams{TenantID: "acme", AdmissionID: res.AdmissionID, InputTokens: 10}); err != nil && !errors.Is(err, rule.ErrConflict) {
		t.Fatalf("second settle: %v", err)
	}
}
