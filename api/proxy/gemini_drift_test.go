package proxy_test

import (
	"fmt"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/genai"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
)

// TestGeminiEstimateBiasInTheDriftReport: the drift report shows the
// Gemini estimate's bias by model. Calls to gemini-2.5-flash that use far
// less than they reserved (a short answer to a 100-token cap) show a
// positive mean relative error; calls to gemini-2.5-pro whose prompt
// Google counts far above the estimate's count (as when the stated factor
// is low for a tenant's text) show a negative one, and their estimated
// input below the actual; each row's sums are the admissions' own, and its
// mean is theirs exactly.
func TestGeminiEstimateBiasInTheDriftReport(t *testing.T) {
	t.Parallel()
	b := setupGemini(t, rule.Limits{TokensCapacity: 100_000, TokensRateMicro: 1})
	b.up.behave = func(w http.ResponseWriter, r *http.Request, _ map[string]any) {
		usage := `{"promptTokenCount":4,"candidatesTokenCount":6,"totalTokenCount":10}` // under the estimate
		if strings.Contains(r.URL.Path, "gemini-2.5-pro") {
			usage = `{"promptTokenCount":400,"candidatesTokenCount":10,"totalTokenCount":410}` // over it
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, geminiAnswer("Short.", "STOP", usage))
	}
	c := b.geminiClient(t, false, 0)
	calls := map[string]int{"gemini-2.5-flash": 3, "gemini-2.5-pro": 2}
	for model, n := range calls {
		for range n {
			if _, err := c.Models.GenerateContent(ctx, model, genai.Text("Summarize the report in one line."), &genai.GenerateContentConfig{MaxOutputTokens: 100}); err != nil {
				t.Fatal(err)
			}
		}
	}
	rows, err := b.store.DriftReport(ctx, account.DriftParams{From: time.Now().Add(-time.Hour), ByModel: true})
	if err != nil || len(rows) != 2 {
		t.Fatalf("by model: %+v %v", rows, err)
	}
	byModel := map[string]account.DriftRow{}
	for _, r := range rows {
		byModel[r.Model] = r
	}
	type sums struct {
		n             int64
		estIn, actIn  int64
		relativeError float64
	}
	want := map[string]*sums{}
	for _, a := range b.admissions(t) {
		s := want[a.Estimate.Model]
		if s == nil {
			s = &sums{}
			want[a.Estimate.Model] = s
		}
		s.n++
		s.estIn += a.Estimate.InputTokens
		s.actIn += *a.ActualInput
		s.relativeError += float64(a.Estimate.Cost-*a.ActualCost) / float64(*a.ActualCost)
	}
	for model, n := range calls {
		row, s := byModel[model], want[model]
		if s == nil || row.Admissions != int64(n) || row.Settled != int64(n) || s.n != int64(n) ||
			row.EstimatedInput.Cmp(account.NewTotal(s.estIn)) != 0 || row.ActualInput.Cmp(account.NewTotal(s.actIn)) != 0 ||
			math.Abs(row.MeanRelativeError-s.relativeError/float64(n)) > 1e-9 {
			t.Errorf("%s: row %+v; want %d settled, %+v", model, row, n, s)
		}
	}
	flash, pro := byModel["gemini-2.5-flash"], byModel["gemini-2.5-pro"]
	if flash.MeanRelativeError <= 0 || pro.MeanRelativeError >= 0 {
		t.Fatalf("mean relative error: flash %.3f, pro %.3f; want over-estimated (> 0) and under-estimated (< 0)", flash.MeanRelativeError, pro.MeanRelativeError)
	}
	// The factor's bias reads in the input columns (docs/integrators.md).
	if flash.EstimatedInput.Cmp(flash.ActualInput) <= 0 || pro.EstimatedInput.Cmp(pro.ActualInput) >= 0 {
		t.Fatalf("input: flash %s estimated / %s actual, pro %s / %s; want flash's above, pro's below",
			flash.EstimatedInput, flash.ActualInput, pro.EstimatedInput, pro.ActualInput)
	}
}
