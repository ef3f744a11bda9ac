package admission_test

import (
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/admission"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/integration/pgtest"
)

// traced returns an Admitter on a fresh database whose spans are recorded
// by the SDK, every one sampled, and the exporter holding them.
func traced(t *testing.T, limits rule.Limits, tenants ...string) (*admission.Admitter, *tracetest.InMemoryExporter) {
	t.Helper()
	pool := pgtest.New(t, nil)
	store := account.NewStore(pool)
	for _, id := range tenants {
		if _, err := store.CreateTenant(ctx, account.CreateTenantParams{ID: id, Limits: limits}); err != nil {
			t.Fatal(err)
		}
	}
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(ctx) })
	return admission.New(admission.Config{Store: store, Pool: pool, TracerProvider: tp}), exp
}

func attrsOf(s tracetest.SpanStub) map[string]any {
	m := map[string]any{}
	for _, kv := range s.Attributes {
		m[string(kv.Key)] = kv.Value.AsInterface()
	}
	return m
}

// TestTransactionSpansCountWhatTheyCarried: 32 callers of 4 tenants at
// once. Every decision links to exactly one transaction, and each
// transaction's batch size and tenants are exactly those of the decisions
// that link to it (as each decision's own batch size says too).
func TestTransactionSpansCountWhatTheyCarried(t *testing.T) {
	t.Parallel()
	tenants := []string{"t1", "t2", "t3", "t4"}
	a, exp := traced(t, rule.Limits{TokensCapacity: 1 << 30, TokensRateMicro: rule.Micro}, tenants...)
	var wg sync.WaitGroup
	for i := range 32 {
		wg.Go(func() {
			if _, _, err := a.Reserve(ctx, request(tenants[i%4], 10, 0)); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	spans := exp.GetSpans()
	type carried struct {
		n       int64
		tenants map[string]bool
	}
	byTx := map[string]*carried{}
	decisions := 0
	for _, s := range spans {
		if s.Name != admission.SpanAdmission {
			continue
		}
		decisions++
		if len(s.Links) != 1 {
			t.Fatalf("a decision with %d links", len(s.Links))
		}
		id := s.Links[0].SpanContext.SpanID().String()
		c := byTx[id]
		if c == nil {
			c = &carried{tenants: map[string]bool{}}
			byTx[id] = c
		}
		c.n++
		c.tenants[attrsOf(s)["tokengate.tenant"].(string)] = true
	}
	if decisions != 32 {
		t.Fatalf("%d decision spans, want 32", decisions)
	}
	var total int64
	txs := 0
	for _, s := range spans {
		if s.Name != admission.SpanTransaction {
			continue
		}
		txs++
		at := attrsOf(s)
		c := byTx[s.SpanContext.SpanID().String()]
		if c == nil {
			t.Fatalf("a transaction no decision links to: %v", at)
		}
		if at["tokengate.batch.size"] != c.n || at["tokengate.batch.reserves"] != c.n || at["tokengate.batch.tenants"] != int64(len(c.tenants)) {
			t.Errorf("transaction says %v; its decisions: %d of %d tenants", at, c.n, len(c.tenants))
		}
		if len(s.Links) != int(c.n) {
			t.Errorf("transaction links to %d decisions, carried %d", len(s.Links), c.n)
		}
		total += at["tokengate.batch.size"].(int64)
	}
	t.Logf("%d transactions carried 32 decisions", txs)
	if txs >= 32 { // each transaction takes milliseconds; the callers start in microseconds
		t.Fatal("no transaction carried more than one decision")
	}
	if total != 32 || txs != len(byTx) {
		t.Fatalf("%d transactions carried %d decisions; %d linked to", txs, total, len(byTx))
	}
	for _, s := range spans {
		if s.Name == admission.SpanAdmission {
			if got, want := attrsOf(s)["tokengate.batch.size"], byTx[s.Links[0].SpanContext.SpanID().String()].n; got != want {
				t.Errorf("a decision says batch size %v, its transaction carried %d", got, want)
			}
		}
	}
}

// TestDecisionSpanWaitedForTokens: a caller that waits for refill
// (max_wait) is admitted, and its span says it waited, and how long; a
// caller that does not wait is refused, with the limit and when to retry.
func TestDecisionSpanWaitedForTokens(t *testing.T) {
	t.Parallel()
	// 50 tokens/s: the bucket takes 2 s to refill, so a stall on the real
	// clock shorter than that neither admits the second nor spares the
	// third its wait. (At 1000/s, 100 ms did.)
	a, exp := traced(t, rule.Limits{TokensCapacity: 100, TokensRateMicro: 50 * rule.Micro, MaxWait: 5 * time.Second}, "acme")
	if _, _, err := a.Reserve(ctx, request("acme", 100, 0)); err != nil { // empty the bucket
		t.Fatal(err)
	}
	if _, _, err := a.Reserve(ctx, request("acme", 100, 0)); err == nil {
		t.Fatal("admitted from an empty bucket")
	}
	if _, _, err := a.Reserve(ctx, request("acme", 100, 4*time.Second)); err != nil {
		t.Fatal(err)
	}
	var adm []map[string]any
	for _, s := range exp.GetSpans() {
		if s.Name == admission.SpanAdmission {
			adm = append(adm, attrsOf(s))
		}
	}
	if len(adm) != 3 {
		t.Fatalf("%d admission spans", len(adm))
	}
	refused, waited := adm[1], adm[2]
	if refused["tokengate.outcome"] != "rejected" || refused["tokengate.limit"] != "tokens" || refused["tokengate.level"] != "acme" ||
		refused["tokengate.retry_after_ms"].(int64) <= 0 || refused["tokengate.waits"] != nil {
		t.Errorf("refused: %v", refused)
	}
	if waited["tokengate.outcome"] != "admitted" || waited["tokengate.waits"].(int64) < 1 || waited["tokengate.waited_ms"].(float64) <= 0 {
		t.Errorf("waited: %v", waited)
	}
	if adm[0]["tokengate.waits"] != nil {
		t.Errorf("the first waited: %v", adm[0])
	}
}
