package main

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/budget"
	"github.com/tokengate/tokengate/budget/admission"
	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/integration/otlptest"
	"github.com/tokengate/tokengate/integration/pgtest"
)

// TestServeTracesFromTheEnvironment: `serve` traces when the standard
// OTEL_ variables name a collector, with the service name they give, and
// exports what is left at shutdown; the caller's traceparent makes the
// admission a child of its span.
func TestServeTracesFromTheEnvironment(t *testing.T) {
	rcv := otlptest.Start(t)
	rcv.Setenv(t, "http/protobuf")
	t.Setenv("OTEL_SERVICE_NAME", "tokengate-eu")
	t.Setenv("OTEL_TRACES_SAMPLER", "parentbased_always_on")
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "60000") // nothing leaves before shutdown
	ctx := context.Background()
	dbURL := pgtest.EmptyURL(t)
	addr := freeAddr(t)
	stop := startServe(t, []string{"serve", "--database-url", dbURL, "--migrate", "--addr", addr, "--log-level", "error"}, "http://"+addr+"/readyz")
	pool := pgtest.Pool(t, dbURL, nil)
	if _, err := budget.NewStore(pool).CreateTenant(ctx, budget.CreateTenantParams{ID: "acme", Limits: budget.Limits{TokensCapacity: 1000, TokensRateMicro: 1}}); err != nil {
		t.Fatal(err)
	}
	_, key, err := credential.KeyCreate(ctx, pool, "acme")
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/admissions",
		strings.NewReader(`{"model":"gpt-4o","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Traceparent", "00-5b8efff798038103d269b633813fc60c-eee19b7ec3c1b174-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("admission: %d", resp.StatusCode)
	}
	stop() // shuts tracing down: its spans are exported
	adm := otlptest.Named(rcv.Spans(), admission.SpanAdmission)
	if len(adm) != 1 {
		t.Fatalf("%d admission spans after shutdown, want 1", len(adm))
	}
	if a := adm[0]; a.TraceID != "5b8efff798038103d269b633813fc60c" || a.ParentSpanID != "eee19b7ec3c1b174" ||
		a.Resource["service.name"] != "tokengate-eu" || a.Attrs["tokengate.outcome"] != "admitted" {
		t.Fatalf("admission span %+v", a)
	}
}
