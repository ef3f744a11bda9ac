package rls_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tokengate/tokengate/api/rls"
	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/admission"
	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/budget/replica"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
	"github.com/tokengate/tokengate/integration/pgtest"
	"github.com/tokengate/tokengate/ledger"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var ctx = context.Background()

type bundle struct {
	pool    *pgxpool.Pool
	store   *account.Store
	client  rlsv3.RateLimitServiceClient
	srv     *rls.Server
	reg     *prometheus.Registry
	gateway string // the credential, "Bearer"-less

	admitter   *admission.Admitter
	rejections *account.Rejections
	est        *estimator.Estimator // the replica's model table
}

// setup serves the rate limit service on a real TCP listener, as Envoy
// reaches it, and returns the generated client of go-control-plane.
func setup(t *testing.T) *bundle { t.Helper(); return setupWith(t, nil) }

// setupWith is setup with the pool configured by configure.
func setupWith(t *testing.T, configure func(*pgxpool.Config)) *bundle {
	t.Helper()
	return setupTraced(t, configure, nil)
}

// setupTraced is setupWith with the replica's tracing.
func setupTraced(t *testing.T, configure func(*pgxpool.Config), tracing *replica.Tracing) *bundle {
	t.Helper()
	pool := pgtest.New(t, configure)
	store := account.NewStore(pool)
	reg := prometheus.NewRegistry()
	rejections := account.NewRejections(pool)
	rep, err := replica.New(replica.Config{DB: pool, Store: store, Registry: reg, Rejections: rejections,
		AuthFailuresPerSecond: 1000, AuthFailureBurst: 1000, Tracing: tracing})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rep.Close)
	a := rep.Admitter
	srv := rls.New(rep)
	client := serve(t, srv)
	// One token per 100 s: the service decides on the real clock, and the
	// tests check balances (the replayed 700 exactly) that 1/s moved in a
	// second's stall.
	for _, id := range []string{"acme", "globex", "initech"} {
		if _, err := store.CreateTenant(ctx, account.CreateTenantParams{ID: id, Limits: rule.Limits{TokensCapacity: 1000, TokensRateMicro: rule.Micro / 100}}); err != nil {
			t.Fatal(err)
		}
	}
	_, secret, err := credential.GatewayCreate(ctx, pool, "envoy-1", []string{"acme", "globex"})
	if err != nil {
		t.Fatal(err)
	}
	return &bundle{pool: pool, store: store, client: client, srv: srv, reg: reg, gateway: secret,
		admitter: a, rejections: rejections, est: rep.Estimator}
}

// serve serves srv on a real TCP listener, as Envoy reaches it, and
// returns the generated client of go-control-plane.
func serve(t *testing.T, srv *rls.Server) rlsv3.RateLimitServiceClient {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(rls.ServerOptions()...)
	rlsv3.RegisterRateLimitServiceServer(gs, srv)
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn)
}

// call asks as Envoy does: descriptors of entries, the gateway credential
// in the metadata.
func (b *bundle) call(t *testing.T, cred string, hits uint32, ds ...*ratelimitv3.RateLimitDescriptor) (*rlsv3.RateLimitResponse, error) {
	t.Helper()
	cctx := ctx
	if cred != "" {
		cctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+cred)
	}
	return b.client.ShouldRateLimit(cctx, &rlsv3.RateLimitRequest{Domain: "tokengate", Descriptors: ds, HitsAddend: hits})
}

func desc(kv ...string) *ratelimitv3.RateLimitDescriptor {
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func (b *bundle) balance(t *testing.T, tenant string) int64 {
	t.Helper()
	snap, err := b.store.TenantSnapshot(ctx, tenant)
	if err != nil {
		t.Fatal(err)
	}
	return snap.Tokens()
}

func header(r *rlsv3.RateLimitResponse, key string) string {
	for _, h := range r.GetResponseHeadersToAdd() {
		if h.GetKey() == key {
			return h.GetValue()
		}
	}
	return ""
}

// TestTwoPhasePairReservesThenSettles: the request's call reserves its
// hits; Envoy retrying it gets the same reservation; the stream-end call
// (phase=response) settles with the actual usage; the ledger holds one
// reserve and one settle, exactly as for a direct admission.
func TestTwoPhasePairReservesThenSettles(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for range 2 { // the second is Envoy retrying the call
		r, err := b.call(t, b.gateway, 300, desc("tenant", "acme", "model", "gpt-4o", "request_id", "req-1"))
		if err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("request phase: %v %v", r, err)
		}
		if st := r.Statuses[0]; st.LimitRemaining != 700 || header(r, "x-ratelimit-remaining-tokens") != "700" || header(r, "x-ratelimit-limit-tokens") != "1000" {
			t.Fatalf("remaining %d, headers %v", st.LimitRemaining, r.ResponseHeadersToAdd)
		}
	}
	r, err := b.call(t, b.gateway, 0, &ratelimitv3.RateLimitDescriptor{
		Entries:    desc("tenant", "acme", "request_id", "req-1", "phase", "response").Entries,
		HitsAddend: wrapperspb.UInt64(120), // the actual usage, known at stream end
	})
	if err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("response phase: %v %v", r, err)
	}
	if got := b.balance(t, "acme"); got < 880 || got > 882 { // 1000 - 120, and a little refill
		t.Fatalf("balance %d after the pair; want 880", got)
	}
	entries, _, err := ledger.EntryQuery(ctx, b.pool, ledger.Filter{TenantID: "acme", Limit: 10, Oldest: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 3 || entries[1].Kind != ledger.KindReserve || *entries[1].Estimate != 300 ||
		entries[2].Kind != ledger.KindSettle || *entries[2].Actual != 120 || entries[2].Actor != "gateway:envoy-1" {
		t.Fatalf("ledger: %+v", entries)
	}
	a, err := b.store.AdmissionGet(ctx, "acme", entries[1].AdmissionID)
	if err != nil || a.State != account.StateSettled {
		t.Fatalf("the admission: %+v %v", a, err)
	}
	if _, err := ledger.Verify(ctx, b.pool, "acme"); err != nil {
		t.Fatal(err)
	}
}

// TestRefundsAndOverLimit: negative hits refund part of a reservation; a
// call over the tenant's allowance gets OVER_LIMIT with the time to wait
// and the headers, and debits nothing; a stream-end call for a request
// that was refused changes nothing.
func TestRefundsAndOverLimit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if r, err := b.call(t, b.gateway, 900, desc("tenant", "globex", "request_id", "big")); err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("%v %v", r, err)
	}
	refund := &ratelimitv3.RateLimitDescriptor{Entries: desc("tenant", "globex", "request_id", "big").Entries,
		HitsAddend: wrapperspb.UInt64(400), IsNegativeHits: true}
	if r, err := b.call(t, b.gateway, 0, refund); err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("refund: %v %v", r, err)
	}
	if got := b.balance(t, "globex"); got < 500 || got > 502 {
		t.Fatalf("balance %d after a 400 refund of 900; want 500", got)
	}
	r, err := b.call(t, b.gateway, 800, desc("tenant", "globex", "request_id", "too-much"))
	if err != nil || r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || r.Statuses[0].DurationUntilReset.AsDuration() < 200*time.Second ||
		header(r, "retry-after") == "" {
		t.Fatalf("over the allowance: %v %v", r, err)
	}
	if r, err := b.call(t, b.gateway, 0, &ratelimitv3.RateLimitDescriptor{Entries: desc("tenant", "globex", "request_id", "too-much", "phase", "response").Entries,
		HitsAddend: wrapperspb.UInt64(800)}); err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("stream end of a refused request: %v %v", r, err)
	}
	if tally, err := ledger.Verify(ctx, b.pool, "globex"); err != nil || tally.Entries != 3 {
		t.Fatalf("%d entries (%v): want creation, reserve, settle", tally.Entries, err)
	}
	// The refusal is counted as the API counts its own (issue 22): in
	// tokengate_admissions_total, by face, and in the dashboard's tally,
	// which the throttled alerts read.
	for _, c := range []struct {
		outcome, limit string
		want           float64
	}{{"admitted", "", 1}, {"rejected", "tokens", 1}} {
		if got := testutil.ToFloat64(b.admitter.Admissions(admission.FaceRLS, c.outcome, c.limit)); got != c.want {
			t.Errorf("tokengate_admissions_total{face=rls,outcome=%s}: %v, want %v", c.outcome, got, c.want)
		}
	}
	if err := b.rejections.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	var tallied int64
	if err := b.pool.QueryRow(ctx, `SELECT coalesce(sum(count), 0) FROM rejection_counts WHERE tenant_id = 'globex' AND limit_name = 'tokens' AND NOT shadow`).Scan(&tallied); err != nil {
		t.Fatal(err)
	}
	if tallied != 1 {
		t.Fatalf("the dashboard's tally holds %d refusals, want the RLS's 1", tallied)
	}
}

// TestBadCallsAndCredentials: a call without a tenant, a response phase
// without a request id, a request id no idempotency key may be, and absurd
// hits are InvalidArgument; a missing or
// wrong credential, and a tenant outside the gateway's scope, are
// OVER_LIMIT with nothing debited, and counted.
func TestBadCallsAndCredentials(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for name, d := range map[string]*ratelimitv3.RateLimitDescriptor{
		"no tenant":           desc("model", "gpt-4o"),
		"response without id": desc("tenant", "acme", "phase", "response"),
		"unknown phase":       desc("tenant", "acme", "phase", "later"),
		"absurd hits":         {Entries: desc("tenant", "acme").Entries, HitsAddend: wrapperspb.UInt64(1 << 40)},
		"more than capacity":  {Entries: desc("tenant", "acme").Entries, HitsAddend: wrapperspb.UInt64(5000)},
		// The request id keys the reservation: the idempotency keys' rule
		// of every face applies to it.
		"request id with a space": desc("tenant", "acme", "request_id", "req 1"),
		"request id too long":     desc("tenant", "acme", "request_id", strings.Repeat("r", 252)),
	} {
		if _, err := b.call(t, b.gateway, 0, d); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("%s: %v", name, err)
		}
	}
	if _, err := b.call(t, b.gateway, 0); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("no descriptor: %v", err)
	}
	wrong := b.gateway[:len(b.gateway)-1] + map[bool]string{true: "b", false: "a"}[b.gateway[len(b.gateway)-1] == 'a']
	for name, cred := range map[string]string{"no credential": "", "wrong secret": wrong, "a tenant key": "tg_aaaaaaaaaaaa_" + "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"} {
		r, err := b.call(t, cred, 10, desc("tenant", "acme"))
		if err != nil || r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("%s: %v %v", name, r, err)
		}
	}
	r, err := b.call(t, b.gateway, 10, desc("tenant", "initech")) // not in the gateway's scope
	if err != nil || r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("out of scope: %v %v", r, err)
	}
	if got := testutil.ToFloat64(b.srv.Refused("unauthenticated")); got != 3 {
		t.Fatalf("%v unauthenticated calls counted; want 3", got)
	}
	if got := testutil.ToFloat64(b.srv.Refused("out_of_scope")); got != 1 {
		t.Fatalf("%v out-of-scope calls counted; want 1", got)
	}
	for _, id := range []string{"acme", "initech"} {
		if tally, err := ledger.Verify(ctx, b.pool, id); err != nil || tally.Entries != 1 {
			t.Fatalf("%s: %d entries (%v): a refused call debited", id, tally.Entries, err)
		}
	}
}

// TestConcurrentCallsKeepOneAllowance: 50 callers make 8 calls each, as
// many gateway workers would, against one tenant: what the answers say was
// admitted is exactly what the ledger holds, within capacity plus refill,
// and some calls were refused.
func TestConcurrentCallsKeepOneAllowance(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var ok, over atomic.Int64
	var okHits atomic.Int64
	var wg sync.WaitGroup
	for g := range 50 {
		wg.Go(func() {
			for i := range 8 {
				hits := uint32(5 + (g*7+i*3)%40)
				r, err := b.call(t, b.gateway, hits, desc("tenant", "acme", "request_id", fmt.Sprintf("g%d-%d", g, i)))
				switch {
				case err != nil:
					t.Error(err)
					return
				case r.OverallCode == rlsv3.RateLimitResponse_OK:
					ok.Add(1)
					okHits.Add(int64(hits))
				default:
					over.Add(1)
				}
			}
		})
	}
	wg.Wait()
	tally, err := ledger.Verify(ctx, b.pool, "acme")
	if err != nil {
		t.Fatal(err)
	}
	var reserved, n, refill int64
	if err := b.pool.QueryRow(ctx, `SELECT coalesce(sum(estimate) FILTER (WHERE kind = 'reserve'), 0), count(*) FILTER (WHERE kind = 'reserve'),
		sum(refill_micro) FROM ledger_entries WHERE tenant_id = 'acme'`).Scan(&reserved, &n, &refill); err != nil {
		t.Fatal(err)
	}
	if n != ok.Load() || reserved != okHits.Load() {
		t.Fatalf("answers: %d OK for %d hits; ledger: %d reserves for %d", ok.Load(), okHits.Load(), n, reserved)
	}
	if reserved*rule.Micro != 1000*rule.Micro+refill-tally.BalanceMicro || over.Load() == 0 {
		t.Fatalf("reserved %d, refill %d, balance %d, %d refused", reserved, refill, tally.BalanceMicro, over.Load())
	}
}

// TestResponseHitsBeyondTheBoundAreInvalid: a stream-end call reporting
// more usage than the model's context window (a billion hits on a cost-1
// reservation: issue 21) is INVALID_ARGUMENT, and nothing moves.
func TestResponseHitsBeyondTheBoundAreInvalid(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if r, err := b.call(t, b.gateway, 1, desc("tenant", "acme", "model", "gpt-4o", "request_id", "req-1")); err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("request phase: %v %v", r, err)
	}
	var seq, before int64
	read := func() (int64, int64) {
		t.Helper()
		var s, m int64
		if err := b.pool.QueryRow(ctx, `SELECT ledger_seq, tokens_micro FROM tenants WHERE id = 'acme'`).Scan(&s, &m); err != nil {
			t.Fatal(err)
		}
		return s, m
	}
	seq, before = read()
	for _, hits := range []uint64{1_000_000_000, 128_001} {
		_, err := b.call(t, b.gateway, 0, &ratelimitv3.RateLimitDescriptor{
			Entries:    desc("tenant", "acme", "request_id", "req-1", "phase", "response").Entries,
			HitsAddend: wrapperspb.UInt64(hits),
		})
		if status.Code(err) != codes.InvalidArgument {
			t.Fatalf("response hits %d: %v, want INVALID_ARGUMENT", hits, err)
		}
		if s, m := read(); s != seq || m != before {
			t.Fatalf("response hits %d moved the ledger or the balance", hits)
		}
	}
	if r, err := b.call(t, b.gateway, 0, &ratelimitv3.RateLimitDescriptor{
		Entries:    desc("tenant", "acme", "request_id", "req-1", "phase", "response").Entries,
		HitsAddend: wrapperspb.UInt64(128_000),
	}); err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("response at the window: %v %v", r, err)
	}
	if _, err := ledger.Verify(ctx, b.pool, "acme"); err != nil {
		t.Fatal(err)
	}
}

// TestStreamEndBeforeItsAdmissionIsKept: a stream-end call whose request
// the store does not know is answered OK either way; it is kept for a
// local admission not replayed yet only when the request's failure policy
// could be local: here its model's, which the call names. A stream end of
// a request whose policy is reject (a refused request's) keeps nothing.
func TestStreamEndBeforeItsAdmissionIsKept(t *testing.T) {
	t.Parallel()
	b := setup(t)
	table, err := estimator.DefaultTable().With([]estimator.Model{{Name: "edge-local", Encoding: estimator.EncodingO200K,
		InputWeightMicro: estimator.WeightOne, OutputWeightMicro: estimator.WeightOne, DefaultOutputTokens: 1000, ContextWindow: 8000,
		PartTokens: 100, OnStoreUnavailable: "local"}})
	if err != nil {
		t.Fatal(err)
	}
	b.est.SetTable(table)
	for _, c := range []struct {
		id, model string
		kept      bool
	}{{"refused-1", "", false}, {"refused-2", "gpt-4o", false}, {"local-1", "edge-local", true}} {
		r, err := b.call(t, b.gateway, 0, &ratelimitv3.RateLimitDescriptor{
			Entries:    desc("tenant", "acme", "model", c.model, "request_id", c.id, "phase", "response").Entries,
			HitsAddend: wrapperspb.UInt64(6),
		})
		if err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("%s: %v %v", c.id, r, err)
		}
		var kept int
		if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM deferred_settles WHERE key = $1`, rule.FaceRLS.StoredKey("rls:"+c.id)).Scan(&kept); err != nil {
			t.Fatal(err)
		}
		if (kept == 1) != c.kept {
			t.Fatalf("%s (model %q): %d kept, want kept %v", c.id, c.model, kept, c.kept)
		}
	}
	if got := b.balance(t, "acme"); got != 1000 {
		t.Fatalf("balance %d: a stream end without an admission moved it", got)
	}
}
