package rls_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tokengate/tokengate/api/rls"
	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/admission"
	"github.com/tokengate/tokengate/budget/replica"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/ledger"
)

// TestInvalidCallIsCountedAsInvalid: a call the service cannot decide is
// an admission attempt, counted in tokengate_admissions_total with outcome
// invalid, as the HTTP API and the proxy count theirs, and never as an
// error (which alerts read as an outage).
func TestInvalidCallIsCountedAsInvalid(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, d := range []*ratelimitv3.RateLimitDescriptor{desc("model", "gpt-4o"), desc("tenant", "acme", "request_id", "req 1")} {
		if _, err := b.call(t, b.gateway, 10, d); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("%v: %v, want INVALID_ARGUMENT", d, err)
		}
	}
	if got := testutil.ToFloat64(b.admitter.Admissions(admission.FaceRLS, admission.OutcomeInvalid, "")); got != 2 {
		t.Fatalf("tokengate_admissions_total{face=rls,outcome=invalid} = %v, want 2", got)
	}
	if got := testutil.ToFloat64(b.admitter.Admissions(admission.FaceRLS, admission.OutcomeError, "")); got != 0 {
		t.Fatalf("tokengate_admissions_total{face=rls,outcome=error} = %v, want 0", got)
	}
}

// pair is a call of two descriptors, one on acme and one on globex, of
// one request.
func pair(id string) []*ratelimitv3.RateLimitDescriptor {
	return []*ratelimitv3.RateLimitDescriptor{desc("tenant", "acme", "request_id", id), desc("tenant", "globex", "request_id", id)}
}

// callOn is call through client.
func callOn(client rlsv3.RateLimitServiceClient, cred string, hits uint32, ds []*ratelimitv3.RateLimitDescriptor) (*rlsv3.RateLimitResponse, error) {
	cctx := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+cred)
	return client.ShouldRateLimit(cctx, &rlsv3.RateLimitRequest{Domain: "tokengate", Descriptors: ds, HitsAddend: hits})
}

// TestDescriptorsAreOneDecision: a call whose second descriptor is refused
// debits neither: the first is answered OK (its own limits admitted it)
// with its tenant's balances untouched, the second OVER_LIMIT, and
// acme's ledger holds no entry of the call at all: nothing was reserved,
// so nothing was released.
func TestDescriptorsAreOneDecision(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if r, err := b.call(t, b.gateway, 900, desc("tenant", "globex", "request_id", "drain")); err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("drain: %v %v", r, err)
	}
	r, err := b.call(t, b.gateway, 300, pair("both")...)
	if err != nil || r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || len(r.Statuses) != 2 {
		t.Fatalf("%v %v, want OVER_LIMIT with two statuses", r, err)
	}
	if a, g := r.Statuses[0], r.Statuses[1]; a.Code != rlsv3.RateLimitResponse_OK || a.LimitRemaining != 1000 ||
		g.Code != rlsv3.RateLimitResponse_OVER_LIMIT || header(r, "retry-after") == "" {
		t.Fatalf("statuses %v / %v, headers %v", a, g, r.ResponseHeadersToAdd)
	}
	if tally, err := ledger.Verify(ctx, b.pool, "acme"); err != nil || tally.Entries != 1 || tally.BalanceMicro != 1000*rule.Micro {
		t.Fatalf("acme: %+v %v, want its creation alone and a full balance", tally, err)
	}
	if got := testutil.ToFloat64(b.admitter.Admissions(admission.FaceRLS, admission.OutcomeWithheld, "")); got != 1 {
		t.Fatalf("tokengate_admissions_total{face=rls,outcome=withheld} = %v, want 1", got)
	}
	// Once globex has room, the same call debits both.
	r, err = b.call(t, b.gateway, 50, pair("both-again")...)
	if err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].LimitRemaining != 950 {
		t.Fatalf("%v %v, want OK with 950 left on acme", r, err)
	}
}

// TestConcurrentPairsAllOrNone: 24 callers over three replicas (each with
// two pipelines, so several transactions on several connections race for
// the same two rows) make calls of two descriptors, 10 hits on acme and 10 on
// globex, which has 400 left and refuses most of them. Exactly: what acme
// debited equals what globex debited equals 10 times the calls answered
// OK; every reservation on one has its partner on the other; no release
// entry exists (the undo path is gone); and globex's debits are its
// allowance and refill, less its balance.
func TestConcurrentPairsAllOrNone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if r, err := b.call(t, b.gateway, 600, desc("tenant", "globex", "request_id", "drain")); err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("drain: %v %v", r, err)
	}
	// The replicas wait for their turn longer than a live one would: on a
	// CPU-starved machine, transactions of several replicas queueing on
	// the same two rows may take seconds, and a busy answer is not what
	// this test is about.
	var clients []rlsv3.RateLimitServiceClient
	for range 3 {
		rep, err := replica.New(replica.Config{DB: b.pool, Store: account.NewStore(b.pool), Registry: prometheus.NewRegistry(),
			Pipelines: 2, StoreTimeout: 20 * time.Second, AuthFailuresPerSecond: 1000, AuthFailureBurst: 1000})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(rep.Close)
		clients = append(clients, serve(t, rls.New(rep)))
	}
	const hits = 10
	var ok, over atomic.Int64
	var wg sync.WaitGroup
	for g := range 24 {
		wg.Go(func() {
			client := clients[g%len(clients)]
			for i := range 6 {
				r, err := callOn(client, b.gateway, hits, pair(fmt.Sprintf("g%d-%d", g, i)))
				switch {
				case err != nil:
					t.Error(err)
					return
				case r.OverallCode == rlsv3.RateLimitResponse_OK:
					ok.Add(1)
				case r.Statuses[0].Code != rlsv3.RateLimitResponse_OK || r.Statuses[1].Code != rlsv3.RateLimitResponse_OVER_LIMIT:
					t.Errorf("refused call: statuses %v, want acme OK (withheld) and globex OVER_LIMIT", r.Statuses)
					return
				default:
					over.Add(1)
				}
			}
		})
	}
	wg.Wait()
	type debits struct{ reserves, reserved, releases, refill int64 }
	of := func(tenant string) debits {
		t.Helper()
		var d debits
		if err := b.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE kind = 'reserve'), coalesce(sum(estimate) FILTER (WHERE kind = 'reserve'), 0),
			count(*) FILTER (WHERE kind = 'release'), sum(refill_micro)
			FROM ledger_entries WHERE tenant_id = $1 AND (admission_id IS NULL OR admission_id NOT IN
				(SELECT admission_id FROM idempotency_keys WHERE tenant_id = 'globex' AND key = $2))`,
			tenant, rule.FaceRLS.StoredKey("rls:drain")).Scan(&d.reserves, &d.reserved, &d.releases, &d.refill); err != nil {
			t.Fatal(err)
		}
		return d
	}
	acme, globex := of("acme"), of("globex")
	n := ok.Load()
	if acme.reserves != n || globex.reserves != n || acme.reserved != n*hits || globex.reserved != n*hits {
		t.Fatalf("%d calls OK; ledger: acme %+v, globex %+v", n, acme, globex)
	}
	if acme.releases != 0 || globex.releases != 0 {
		t.Fatalf("releases in the ledger (acme %d, globex %d): a refused call was debited and undone", acme.releases, globex.releases)
	}
	var unpaired int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM (
		(SELECT key FROM idempotency_keys WHERE tenant_id = 'acme' EXCEPT SELECT key FROM idempotency_keys WHERE tenant_id = 'globex')
		UNION ALL
		(SELECT key FROM idempotency_keys WHERE tenant_id = 'globex' AND key <> $1 EXCEPT SELECT key FROM idempotency_keys WHERE tenant_id = 'acme')) u`,
		rule.FaceRLS.StoredKey("rls:drain")).Scan(&unpaired); err != nil {
		t.Fatal(err)
	}
	if unpaired != 0 {
		t.Fatalf("%d requests reserved on one tenant and not the other", unpaired)
	}
	tally, err := ledger.Verify(ctx, b.pool, "globex")
	if err != nil {
		t.Fatal(err)
	}
	if (600+n*hits)*rule.Micro != 1000*rule.Micro+globex.refill-tally.BalanceMicro || over.Load() == 0 || n == 0 {
		t.Fatalf("globex: reserved %d, refill %d, balance %d; %d OK, %d refused", 600+n*hits, globex.refill, tally.BalanceMicro, n, over.Load())
	}
	if n*hits > 400+globex.refill/rule.Micro+1 {
		t.Fatalf("%d calls OK took %d from globex, which had 400 and %d of refill", n, n*hits, globex.refill/rule.Micro)
	}
}
