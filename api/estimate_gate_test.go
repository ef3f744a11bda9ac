package api_test

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestEstimateGateRefusesPastItsWait: while a tenant holds its whole share
// of the replica's estimate gate (as its own large bodies being estimated
// do), its next body waits its turn for the gate's wait and is answered
// 503 estimator_busy with Retry-After, on /v1/estimate and on
// /v1/admissions, debiting nothing; another tenant is estimated and
// admitted meanwhile; and once the share is given back, the
// tenant is served again. The refusals and waits are in /metrics.
func TestEstimateGateRefusesPastItsWait(t *testing.T) {
	t.Parallel()
	const wait = 300 * time.Millisecond // real time is the subject: the wait
	b := setupAPI(t, func(c *testConfig) {
		c.replicaConfig.EstimateBytes = 4 << 20
		c.replicaConfig.EstimateTenantBytes = 1 << 20
		c.replicaConfig.EstimateWait = wait
	})
	acme := b.tenant(t, "acme", lim(1_000_000, "1"))
	globex := b.tenant(t, "globex", lim(1_000_000, "1"))
	body := chat(10, "Hello there")
	if res := b.call(t, acme, http.MethodPost, "/v1/estimate", body); res.Code != http.StatusOK {
		t.Fatalf("before: %d %s", res.Code, res.Body)
	}
	micro, seq := b.balance(t, "acme")

	// acme's share taken, as by acme's bodies being estimated.
	release, err := b.rep.EstimateGate.Acquire(ctx, "acme", 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/v1/estimate", "/v1/admissions"} {
		start := time.Now()
		res := b.call(t, acme, http.MethodPost, path, body)
		took := time.Since(start)
		e := res.errorBody().Error
		if res.Code != http.StatusServiceUnavailable || e.Type != "estimator_busy" || res.Header().Get("Retry-After") == "" || e.RetryAfterMS == nil {
			t.Fatalf("%s with acme's share taken: %d %s (Retry-After %q); want 503 estimator_busy with Retry-After", path, res.Code, res.Body, res.Header().Get("Retry-After"))
		}
		if took < wait || took > wait+5*time.Second {
			t.Errorf("%s answered after %s; want after the gate's wait of %s", path, took, wait)
		}
		// Another tenant is served meanwhile (were it held back by acme's
		// share, it would be refused after the same wait).
		if res := b.call(t, globex, http.MethodPost, path, body); res.Code >= 300 {
			t.Fatalf("%s for globex while acme's share is taken: %d %s", path, res.Code, res.Body)
		}
	}
	if m, s := b.balance(t, "acme"); m != micro || s != seq {
		t.Errorf("acme's balance %d, ledger %d after its refusals; was %d, %d", m, s, micro, seq)
	}
	release()
	if res := b.call(t, acme, http.MethodPost, "/v1/admissions", body); res.Code != http.StatusCreated {
		t.Fatalf("after the share was given back: %d %s", res.Code, res.Body)
	}

	metrics := b.call(t, "", http.MethodGet, "/metrics", "").Body.String()
	for _, want := range []string{"tokengate_estimator_refusals_total 2", "tokengate_estimator_bytes_limit 4.194304e+06", "tokengate_estimator_bytes_in_use 0"} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics has no %q", want)
		}
	}
	if !strings.Contains(metrics, "tokengate_estimator_waits_total ") || strings.Contains(metrics, "tokengate_estimator_waits_total 0\n") {
		t.Errorf("/metrics counts no waits")
	}
}
