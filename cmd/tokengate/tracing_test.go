package main

import (
	"context"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/admission"
	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/budget/rule"
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
	if _, err := account.NewStore(pool).CreateTenant(ctx, account.CreateTenantParams{ID: "acme", Limits: rule.Limits{TokensCapacity: 1000, TokensRateMicro: 1}}); err != nil {
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

// TestServeExitsOnABadTracingVariable: `serve` with an OTEL_ variable the
// SDK would misread exits with status 1 and a message naming it, as an
// operator sees it (the test binary runs main in a child process): never a
// panic (a negative OTEL_BSP_MAX_QUEUE_SIZE made the batch processor's
// channel panic, status 2), never a replica exporting to localhost.
func TestServeExitsOnABadTracingVariable(t *testing.T) {
	if args := os.Getenv("TOKENGATE_TEST_MAIN"); args != "" {
		os.Args = append([]string{"tokengate"}, strings.Fields(args)...)
		main()
		os.Exit(0)
	}
	dbURL := pgtest.EmptyURL(t)
	for _, tc := range []struct{ key, value string }{
		{"OTEL_BSP_MAX_QUEUE_SIZE", "-5"},
		{"OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318"},
	} {
		t.Run(tc.key, func(t *testing.T) {
			// A serve that accepted the value would run until killed: 60 s
			// is far past a start that fails on the environment.
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestServeExitsOnABadTracingVariable$")
			cmd.Env = append(os.Environ(),
				"TOKENGATE_TEST_MAIN=serve --database-url "+dbURL+" --migrate --addr "+freeAddr(t)+" --log-level error",
				"OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:1", tc.key+"="+tc.value)
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if ctx.Err() != nil {
				t.Fatalf("serve with %s=%s was still serving after 60 s; output:\n%s", tc.key, tc.value, out)
			}
			if !errors.As(err, &exit) || exit.ExitCode() != 1 {
				t.Fatalf("serve with %s=%s: %v, want exit status 1; output:\n%s", tc.key, tc.value, err, out)
			}
			if want := "tokengate: tracing: " + tc.key + "="; !strings.Contains(string(out), want) || strings.Contains(string(out), "panic") {
				t.Fatalf("serve with %s=%s said:\n%s\nwant a line with %q and no panic", tc.key, tc.value, out, want)
			}
		})
	}
}
