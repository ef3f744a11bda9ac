package rls_test

import (
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/admission"
)

// TestModelScopeRefusesADescriptorsModel: a descriptor naming a model its
// tenant may not use is answered OVER_LIMIT with nothing debited, counted
// as refused by model_not_allowed and as a rejected admission by
// model_scope; the same tenant's allowed model is admitted.
func TestModelScopeRefusesADescriptorsModel(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.store.SetModels(ctx, account.SetModelsParams{TenantID: "acme", Models: []string{"gpt-4o*"}}); err != nil {
		t.Fatal(err)
	}
	r, err := b.call(t, b.gateway, 300, desc("tenant", "acme", "model", "claude-sonnet-4-5", "request_id", "req-1"))
	if err != nil || r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("a forbidden model: %v %v, want OVER_LIMIT", r, err)
	}
	if got := b.balance(t, "acme"); got < 1000 {
		t.Fatalf("balance %d after a refusal: something was debited", got)
	}
	if got := testutil.ToFloat64(b.srv.Refused("model_not_allowed")); got != 1 {
		t.Fatalf("refused by model_not_allowed: %v, want 1", got)
	}
	if got := testutil.ToFloat64(b.admitter.Admissions(admission.FaceRLS, "rejected", "model_scope")); got != 1 {
		t.Fatalf("tokengate_admissions_total{face=rls,outcome=rejected,limit=model_scope}: %v, want 1", got)
	}
	r, err = b.call(t, b.gateway, 300, desc("tenant", "acme", "model", "gpt-4o-mini", "request_id", "req-2"))
	if err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("an allowed model: %v %v", r, err)
	}
}
