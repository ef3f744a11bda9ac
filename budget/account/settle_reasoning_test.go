package account_test

import (
	"errors"
	"testing"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

// TestSettleReasoningTokens: a settle's reasoning tokens are part of its
// output, 0 to OutputTokens, else a *UsageError naming OpenAI's field
// with the output as its bound; they change nothing the token budget
// charges (reasoning is output).
func TestSettleReasoningTokens(t *testing.T) {
	t.Parallel()
	e := estimator.Estimate{Model: "o4-mini", InputTokens: 10, OutputTokens: 100, Cost: 110}
	for _, r := range []int64{0, 1, 40} {
		p := account.SettleParams{TenantID: "acme", AdmissionID: "adm_1", InputTokens: 30, OutputTokens: 40, ReasoningTokens: r}
		if err := p.Validate(); err != nil {
			t.Errorf("%d reasoning of 40 output: %v", r, err)
		}
		if in, out := p.Usage(e, nil); in != 30 || out != 40 {
			t.Errorf("%d reasoning: Usage = %d, %d; want 30, 40", r, in, out)
		}
	}
	for _, bad := range []account.SettleParams{
		{InputTokens: 30, OutputTokens: 40, ReasoningTokens: 41},
		{InputTokens: 30, OutputTokens: 40, ReasoningTokens: -1},
		{InputTokens: 30, OutputTokens: 0, ReasoningTokens: 1},
		{InputTokens: 30, OutputTokens: -5, ReasoningTokens: 1},
		{RefundTokens: 5, ReasoningTokens: 1},
	} {
		bad.TenantID, bad.AdmissionID = "acme", "adm_1"
		var ue *rule.UsageError
		err := bad.Validate()
		if !errors.As(err, &ue) || ue.Field != "completion_tokens_details.reasoning_tokens" || ue.Bound != max(bad.OutputTokens, 0) ||
			!errors.Is(err, rule.ErrUsageOutOfBounds) {
			t.Errorf("%+v: %v, want a UsageError on completion_tokens_details.reasoning_tokens bounded by the output", bad, err)
		}
	}
}
