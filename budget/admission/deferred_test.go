package admission_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/admission"
	"github.com/tokengate/tokengate/budget/outage"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/integration/await"
	"github.com/tokengate/tokengate/integration/pgtest"
	"github.com/tokengate/tokengate/ledger"
)

// link is a replica's road to Postgres, which a test cuts: cut refuses
// every new connection and drops the pool's, until restore.
type link struct {
	down atomic.Bool
	pool *pgxpool.Pool
}

func (l *link) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if l.down.Load() {
		return nil, errors.New("test: the link to the store is cut")
	}
	return (&net.Dialer{}).DialContext(ctx, network, addr)
}

func (l *link) cut() {
	l.down.Store(true)
	l.pool.Reset()
}

func (l *link) restore() { l.down.Store(false) }

// deferBundle is one database and the replicas a test runs on it.
type deferBundle struct {
	url    string
	direct *pgxpool.Pool
	store  *account.Store // on direct: the test's own view
}

// node is one replica: its admission layer on a pool of its own, through
// a link the test can cut, with its own spool.
type node struct {
	name  string
	link  *link
	pool  *pgxpool.Pool
	store *account.Store
	dir   string
	local *outage.Local
	adm   *admission.Admitter
}

func setupDefer(t *testing.T) *deferBundle {
	t.Helper()
	url := pgtest.URL(t)
	direct := pgtest.Pool(t, url, nil)
	return &deferBundle{url: url, direct: direct, store: account.NewStore(direct)}
}

// replica starts a replica named name; cfg adjusts its admission layer.
func (b *deferBundle) replica(t *testing.T, name string, cfg func(*admission.Config)) *node {
	t.Helper()
	n := &node{name: name, link: &link{}, dir: t.TempDir()}
	n.pool = pgtest.Pool(t, b.url, func(c *pgxpool.Config) {
		c.ConnConfig.DialFunc = n.link.dial
		c.ConnConfig.ConnectTimeout = time.Second
	})
	n.link.pool = n.pool
	n.store = account.NewStore(n.pool)
	t.Cleanup(n.store.Close)
	n.start(t, cfg)
	return n
}

// start runs the replica's admission layer on its spool: again, it is the
// replica restarted (its memory of the outage is gone, its spool is not).
func (n *node) start(t *testing.T, cfg func(*admission.Config)) {
	t.Helper()
	spool, err := outage.OpenSpool(n.dir, n.name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = spool.Close() })
	n.local = &outage.Local{Replicas: 2, Replica: n.name, Spool: spool}
	c := admission.Config{Store: n.store, Pool: n.pool, Local: n.local, StoreTimeout: time.Second}
	if cfg != nil {
		cfg(&c)
	}
	n.adm = admission.New(c)
}

// tenant creates a tenant with policy and shows it to every replica, as
// its traffic would before an outage.
func (b *deferBundle) tenant(t *testing.T, id string, policy rule.Policy, nodes ...*node) {
	t.Helper()
	l := rule.Limits{TokensCapacity: 10_000, TokensRateMicro: 1, OnStoreUnavailable: policy}
	if _, err := b.store.CreateTenant(ctx, account.CreateTenantParams{ID: id, Limits: l}); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if _, err := n.adm.Snapshot(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
}

// admitLocally admits a gateway's request of cost under key while n is cut
// off from the store.
func (n *node) admitLocally(t *testing.T, tenantID, key string, cost int64) *account.Reservation {
	t.Helper()
	r := request(tenantID, cost, 0)
	r.Face, r.IdempotencyKey, r.Actor, r.Body = admission.FaceRLS, key, "gateway:edge", []byte(key)
	res, local, err := n.adm.Reserve(ctx, r)
	if err != nil || !local {
		t.Fatalf("%s: reserve %s during the outage: local %v, %v", n.name, key, local, err)
	}
	return res
}

// settle is a gateway's stream-end call for key: a settle by key with the
// usage as input tokens.
func (n *node) settle(tenantID, key string, used int64) (*account.Settlement, bool, error) {
	return n.adm.Settle(ctx, admission.FaceRLS, account.SettleParams{TenantID: tenantID, IdempotencyKey: key, InputTokens: used,
		Actor: "gateway:" + n.name})
}

// recover runs n's recovery loop until its spool is replayed.
func (n *node) recover() error {
	if !await.For(20*time.Second, 20*time.Millisecond, func() bool {
		n.adm.RecoverOnce(ctx)
		size, err := n.local.Spool.Len()
		return err == nil && size == 0 && !n.adm.Down()
	}) {
		return fmt.Errorf("%s did not replay its spool: %v", n.name, n.adm.Ready())
	}
	return nil
}

func (b *deferBundle) rows(t *testing.T) int {
	t.Helper()
	var n int
	if err := b.direct.QueryRow(ctx, `SELECT count(*) FROM deferred_settles`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// settledOnce checks that admission id ended once, in state, at used
// tokens, by actor: its row, its one end entry.
func (b *deferBundle) settledOnce(t *testing.T, tenantID, id string, state account.State, used int64, actor string) {
	t.Helper()
	a, err := b.store.AdmissionGet(ctx, tenantID, id)
	if err != nil || a.State != state || (state == account.StateSettled && (a.ActualInput == nil || *a.ActualInput != used)) {
		t.Fatalf("admission %s: %+v %v; want %s at %d", id, a, err, state, used)
	}
	entries, _, err := ledger.EntryQuery(ctx, b.direct, ledger.Filter{TenantID: tenantID, AdmissionID: id, Oldest: true, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	var ends []ledger.Entry
	for _, e := range entries {
		if e.Kind != ledger.KindReserve {
			ends = append(ends, e)
		}
	}
	if len(entries) != 1+len(ends) || len(ends) != 1 || string(ends[0].Kind) != map[account.State]string{account.StateSettled: "settle", account.StateReleased: "release"}[state] {
		t.Fatalf("admission %s: ledger %+v; want its reserve and one %s", id, entries, state)
	}
	if actor != "" && ends[0].Actor != actor {
		t.Fatalf("admission %s: ended by %q, want %q", id, ends[0].Actor, actor)
	}
}

func (b *deferBundle) verify(t *testing.T, tenantID string) ledger.Tally {
	t.Helper()
	tally, err := ledger.Verify(ctx, b.direct, tenantID)
	if err != nil {
		t.Fatal(err)
	}
	return tally
}

// wantKept fails t unless n settles and releases are kept.
func (b *deferBundle) wantKept(t *testing.T, n int) {
	t.Helper()
	if got := b.rows(t); got != n {
		t.Fatalf("%d kept rows, want %d", got, n)
	}
}

// replayEnds replays the spool of admitting, the replica that admitted id
// on its own, and checks that id ended settled once at used by actor,
// that nothing is left kept, and that the ledger verifies.
func (b *deferBundle) replayEnds(t *testing.T, admitting *node, tenantID, id string, used int64, actor string) ledger.Tally {
	t.Helper()
	if err := admitting.recover(); err != nil {
		t.Fatal(err)
	}
	b.settledOnce(t, tenantID, id, account.StateSettled, used, actor)
	b.wantKept(t, 0)
	return b.verify(t, tenantID)
}

// TestSettleBeforeReplayOnAnotherReplica is the soak's defect: replica A,
// cut off from Postgres, admits a gateway's request locally (12 hits);
// Postgres is back; the stream-end call (6 hits) reaches replica B before A
// replays, and finds no admission. It is kept, and A's replay applies it:
// the admission ends settled at 6, with one settle entry by B's gateway
// actor, and the ledger verifies. Cut off too, B journals the stream end
// by key with the request's policy, and its replay, first, has the store
// keep it the same way.
func TestSettleBeforeReplayOnAnotherReplica(t *testing.T) {
	t.Parallel()
	for _, bCut := range []bool{false, true} {
		t.Run(fmt.Sprintf("b_cut_off=%v", bCut), func(t *testing.T) {
			t.Parallel()
			b := setupDefer(t)
			ra, rb := b.replica(t, "replica-a", nil), b.replica(t, "replica-b", nil)
			b.tenant(t, "acme", rule.PolicyLocal, ra, rb)

			ra.link.cut()
			if bCut {
				rb.link.cut()
			}
			r := ra.admitLocally(t, "acme", "rls:r21-296", 12)
			if !bCut {
				ra.link.restore()
			}
			st, journaled, err := rb.settle("acme", "rls:r21-296", 6)
			switch {
			case bCut && (err != nil || !journaled):
				t.Fatalf("the stream end at B, cut off: journaled %v, %v", journaled, err)
			case !bCut && (!errors.Is(err, account.ErrDeferred) || !errors.Is(err, rule.ErrAdmissionNotFound) || st != nil || journaled):
				t.Fatalf("the stream end at B before A's replay: %+v %v %v; want it kept (ErrDeferred)", st, journaled, err)
			case !bCut && testutil.ToFloat64(rb.adm.Settlements(admission.FaceRLS, "settle", admission.OutcomeDeferred)) != 1:
				t.Fatal("the kept settle is not counted as deferred")
			}
			if bCut {
				ra.link.restore()
				rb.link.restore()
				if err := rb.recover(); err != nil {
					t.Fatal(err)
				}
			}
			b.wantKept(t, 1)
			if tally := b.replayEnds(t, ra, "acme", r.AdmissionID, 6, "gateway:replica-b"); tally.BalanceMicro/rule.Micro != 10_000-12+6 {
				t.Fatalf("balance %d, want 9994", tally.BalanceMicro/rule.Micro)
			}
		})
	}
}

// TestSettleBeforeReplayOnTheSameReplica: the stream-end call reaches the
// replica that admitted the request locally, before it replays. Restarted
// since (it no longer knows the key, nor that the store was away), it asks
// the store, which keeps the settle for the replay; still marked down, it
// journals it. Either way the admission ends settled once, at its usage.
func TestSettleBeforeReplayOnTheSameReplica(t *testing.T) {
	t.Parallel()
	for _, restarted := range []bool{true, false} {
		t.Run(fmt.Sprintf("restarted=%v", restarted), func(t *testing.T) {
			t.Parallel()
			b := setupDefer(t)
			ra := b.replica(t, "replica-a", nil)
			b.tenant(t, "acme", rule.PolicyLocal, ra)

			ra.link.cut()
			r := ra.admitLocally(t, "acme", "rls:r-1", 12)
			ra.link.restore()
			if restarted {
				ra.start(t, nil)
			}
			_, journaled, err := ra.settle("acme", "rls:r-1", 6)
			switch {
			case restarted && !errors.Is(err, account.ErrDeferred):
				t.Fatalf("settle at the restarted replica: %v; want it kept", err)
			case !restarted && (err != nil || !journaled):
				t.Fatalf("settle at the replica still down: journaled %v, %v", journaled, err)
			}
			b.replayEnds(t, ra, "acme", r.AdmissionID, 6, "gateway:replica-a")
		})
	}
}

// TestRefusedStreamEndKeepsNothing: a settle by key that finds no admission
// is kept only when some replica could have admitted its request locally:
// the request's policy, its model's (the call names it), else its
// tenant's, else the replica's default, is local, and the tenant is not
// nested. Otherwise (a refused request's stream end, frequent) nothing is
// written, and the answer is a plain not found.
func TestRefusedStreamEndKeepsNothing(t *testing.T) {
	t.Parallel()
	b := setupDefer(t)
	models := func(family string) rule.Policy {
		return map[string]rule.Policy{"local-model": rule.PolicyLocal, "reject-model": rule.PolicyReject}[family]
	}
	rejecting := b.replica(t, "rejecting", func(c *admission.Config) { c.ModelPolicyFunc = models })
	lenient := b.replica(t, "lenient", func(c *admission.Config) { c.ModelPolicyFunc, c.DefaultPolicy = models, rule.PolicyLocal })
	b.tenant(t, "strict", rule.PolicyReject)
	b.tenant(t, "loose", rule.PolicyLocal)
	b.tenant(t, "plain", rule.PolicyDefault)
	if _, err := b.store.CreateTenant(ctx, account.CreateTenantParams{ID: "team", Parent: "loose",
		Limits: rule.Limits{TokensCapacity: 1000, TokensRateMicro: 1, OnStoreUnavailable: rule.PolicyLocal}}); err != nil {
		t.Fatal(err)
	}
	for i, c := range []struct {
		n      *node
		tenant string
		family string
		kept   bool
	}{
		{rejecting, "strict", "", false},
		{rejecting, "strict", "reject-model", false},
		{rejecting, "strict", "local-model", true}, // the model's policy comes first
		{rejecting, "loose", "", true},
		{rejecting, "loose", "reject-model", false},
		{rejecting, "plain", "", false}, // the replica's default: reject
		{lenient, "plain", "", true},    // the replica's default: local
		{lenient, "strict", "", false},
		{lenient, "team", "", false}, // nested: never admitted locally
	} {
		key := fmt.Sprintf("rls:r-%d", i)
		before := b.rows(t)
		_, _, err := c.n.adm.Settle(ctx, admission.FaceRLS, account.SettleParams{TenantID: c.tenant, IdempotencyKey: key, InputTokens: 6,
			Family: c.family, Actor: "gateway:edge"})
		if !errors.Is(err, rule.ErrAdmissionNotFound) || errors.Is(err, account.ErrDeferred) != c.kept {
			t.Fatalf("case %d (%s, %s, model %q): %v; want kept %v", i, c.n.name, c.tenant, c.family, err, c.kept)
		}
		if after := b.rows(t); (after == before+1) != c.kept || after < before {
			t.Fatalf("case %d: kept rows %d -> %d; want kept %v", i, before, after, c.kept)
		}
	}
	// A release by key is kept like a settle; a release or settle by id
	// never is (a local admission's id tells its caller to retry).
	if _, _, err := lenient.adm.Release(ctx, admission.FaceRLS, account.ReleaseParams{TenantID: "loose", IdempotencyKey: "rls:rel"}); !errors.Is(err, account.ErrDeferred) {
		t.Fatalf("release by key: %v", err)
	}
	before := b.rows(t)
	if _, _, err := lenient.adm.Settle(ctx, admission.FaceAPI, account.SettleParams{TenantID: "loose", AdmissionID: "adm_nope", InputTokens: 1}); !errors.Is(err, rule.ErrAdmissionNotFound) || errors.Is(err, account.ErrDeferred) {
		t.Fatalf("settle by id: %v", err)
	}
	if b.rows(t) != before {
		t.Fatal("a settle by id was kept")
	}
	for _, id := range []string{"strict", "loose", "plain", "team"} {
		if tally := b.verify(t, id); tally.LastSeq != 1 {
			t.Fatalf("%s: %d ledger entries; a settle that found nothing wrote one", id, tally.LastSeq)
		}
	}
}

// replayHook tells a test each admission its replica has replayed.
type replayHook struct {
	admission.Store
	replayed func(admissionID string)
}

func (h replayHook) ReplayReserve(ctx context.Context, p account.ReplayReserveParams) (bool, error) {
	wrote, err := h.Store.ReplayReserve(ctx, p)
	if err == nil {
		h.replayed(p.AdmissionID)
	}
	return wrote, err
}

// within waits for ch, at most d.
func within(ch <-chan struct{}, d time.Duration) bool {
	select {
	case <-ch:
		return true
	case <-time.After(d):
		return false
	}
}

// TestSettlesRaceTheReplay: replica A admits many requests locally during
// an outage; once Postgres is back, their stream-end calls reach replicas
// B and C from a goroutine each, ordered against A's replay by its
// signals: a third before the replay begins (kept), a third as their own
// admission is being replayed (kept, or found, whichever wins the tenant's
// lock), a third after it (found). Every admission ends exactly once, at
// its own usage (every fifth is released instead), with one end entry, no
// kept row is left, and the ledger verifies.
func TestSettlesRaceTheReplay(t *testing.T) {
	t.Parallel()
	b := setupDefer(t)
	const n = 60
	replayed := make([]chan struct{}, n)
	for i := range replayed {
		replayed[i] = make(chan struct{})
	}
	index := map[string]int{} // admission id -> request; written before the replay starts
	ra := b.replica(t, "replica-a", func(c *admission.Config) {
		c.Store = replayHook{Store: c.Store, replayed: func(id string) { close(replayed[index[id]]) }}
	})
	rb, rc := b.replica(t, "replica-b", nil), b.replica(t, "replica-c", nil)
	b.tenant(t, "acme", rule.PolicyLocal, ra, rb, rc)
	ra.link.cut()
	ids := make([]string, n)
	for i := range n {
		ids[i] = ra.admitLocally(t, "acme", fmt.Sprintf("rls:r-%d", i), 20).AdmissionID
		index[ids[i]] = i
	}
	ra.link.restore()

	end := func(i int) {
		via := []*node{rb, rc}[i%2]
		key := fmt.Sprintf("rls:r-%d", i)
		var err error
		if i%5 == 4 {
			_, _, err = via.adm.Release(ctx, admission.FaceRLS, account.ReleaseParams{TenantID: "acme", IdempotencyKey: key, Actor: "gateway:" + via.name})
		} else {
			_, _, err = via.settle("acme", key, int64(1+i%19))
		}
		if err != nil && !errors.Is(err, account.ErrDeferred) {
			t.Errorf("stream end %d: %v", i, err)
		}
	}
	var early, rest sync.WaitGroup
	for i := range n {
		switch i % 3 {
		case 0: // before the replay
			early.Go(func() { end(i) })
		case 1: // once the admission before it is replayed: racing its own
			rest.Go(func() {
				if within(replayed[i-1], 30*time.Second) {
					end(i)
				}
			})
		case 2: // after its admission is replayed
			rest.Go(func() {
				if within(replayed[i], 30*time.Second) {
					end(i)
				}
			})
		}
	}
	rest.Go(func() {
		early.Wait()
		if err := ra.recover(); err != nil {
			t.Error(err)
		}
	})
	rest.Wait()
	if t.Failed() {
		return
	}
	var kept float64
	for _, x := range []*node{rb, rc} {
		for _, kind := range []string{"settle", "release"} {
			kept += testutil.ToFloat64(x.adm.Settlements(admission.FaceRLS, kind, admission.OutcomeDeferred))
		}
	}
	if kept < n/3 {
		t.Fatalf("%v stream ends were kept, want at least the %d sent before the replay", kept, n/3)
	}
	t.Logf("%v of %d stream ends were kept for the replay", kept, n)

	want := int64(10_000)
	for i, id := range ids {
		if i%5 == 4 {
			b.settledOnce(t, "acme", id, account.StateReleased, 0, "")
			continue
		}
		b.settledOnce(t, "acme", id, account.StateSettled, int64(1+i%19), "")
		want -= int64(1 + i%19)
	}
	b.wantKept(t, 0)
	if tally := b.verify(t, "acme"); tally.BalanceMicro/rule.Micro != want {
		t.Fatalf("balance %d, want %d", tally.BalanceMicro/rule.Micro, want)
	}
}
