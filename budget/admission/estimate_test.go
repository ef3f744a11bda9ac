package admission_test

import (
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/admission"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
	"github.com/tokengate/tokengate/integration/pgtest"
)

type estimateBundle struct {
	a     *admission.Admitter
	store *account.Store
}

// setupEstimate is an Admitter on the seeded model table and a tenant
// acme with room for 10,000 tokens.
func setupEstimate(t *testing.T) *estimateBundle {
	t.Helper()
	pool := pgtest.New(t, nil)
	store := account.NewStore(pool)
	if _, err := store.CreateTenant(ctx, account.CreateTenantParams{ID: "acme",
		Limits: rule.Limits{TokensCapacity: 10_000, TokensRateMicro: 1}}); err != nil {
		t.Fatal(err)
	}
	return &estimateBundle{a: admission.New(admission.Config{Store: store, Pool: pool}), store: store}
}

func parsed(t *testing.T, body string) *estimator.Request {
	t.Helper()
	req, err := estimator.Parse([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// TestAdmitEstimatesAndReserves: Admit estimates a parsed request as the
// estimator does, gives the face's gate back once, and reserves what it
// estimated.
func TestAdmitEstimatesAndReserves(t *testing.T) {
	t.Parallel()
	b := setupEstimate(t)
	body := `{"model":"gpt-4o","max_tokens":50,"max_wait_ms":1500,"messages":[{"role":"user","content":"hello there"}]}`
	want, err := estimator.New(nil).Estimate(parsed(t, body))
	if err != nil {
		t.Fatal(err)
	}
	released := 0
	ad, err := b.a.Admit(ctx, admission.AdmitRequest{Parsed: parsed(t, body), EstimatedFunc: func() { released++ },
		Request: admission.Request{Face: admission.FaceAPI, ReserveParams: account.ReserveParams{TenantID: "acme"}}})
	if err != nil {
		t.Fatal(err)
	}
	if !ad.Decided || ad.Local || released != 1 {
		t.Fatalf("decided %v, local %v, released %d times; want decided, not local, released once", ad.Decided, ad.Local, released)
	}
	if ad.Estimate != want || ad.Reservation.Estimate != want {
		t.Fatalf("estimate %+v, reserved %+v; want %+v", ad.Estimate, ad.Reservation.Estimate, want)
	}
	snap, err := b.store.TenantSnapshot(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if got := snap.Tokens(); got != 10_000-want.Cost {
		t.Fatalf("tokens left %d, want %d (the estimate's cost %d reserved)", got, 10_000-want.Cost, want.Cost)
	}
	if got := testutil.ToFloat64(b.a.Admissions(admission.FaceAPI, admission.OutcomeAdmitted, "")); got != 1 {
		t.Fatalf("admitted %v, want 1", got)
	}
}

// TestAdmitRefusesWhatItCannotEstimate: a request its model cannot take
// (an output cap past the model's limit) is refused naming the field,
// counted as an invalid admission of its face, and reserves nothing; the
// gate is given back all the same.
func TestAdmitRefusesWhatItCannotEstimate(t *testing.T) {
	t.Parallel()
	b := setupEstimate(t)
	released := 0
	ad, err := b.a.Admit(ctx, admission.AdmitRequest{EstimatedFunc: func() { released++ },
		Parsed:  parsed(t, `{"model":"gpt-4o","max_tokens":100000000,"messages":[{"role":"user","content":"hi"}]}`),
		Request: admission.Request{Face: admission.FaceProxy, ReserveParams: account.ReserveParams{TenantID: "acme"}}})
	var inv *estimator.InvalidError
	if !errors.As(err, &inv) || inv.Field != "max_tokens" {
		t.Fatalf("err %v, want an *estimator.InvalidError naming max_tokens", err)
	}
	if ad.Decided || ad.Reservation != nil || released != 1 {
		t.Fatalf("decided %v, reservation %v, released %d times; want undecided, none, released once", ad.Decided, ad.Reservation, released)
	}
	snap, err := b.store.TenantSnapshot(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if got := snap.Tokens(); got != 10_000 {
		t.Fatalf("tokens left %d, want 10000 (nothing reserved)", got)
	}
	if got := testutil.ToFloat64(b.a.Admissions(admission.FaceProxy, admission.OutcomeInvalid, "")); got != 1 {
		t.Fatalf("invalid proxy admissions %v, want 1", got)
	}
}

// TestQuoteReservesNothing: a quote is the estimate Admit would make, and
// counts and reserves nothing.
func TestQuoteReservesNothing(t *testing.T) {
	t.Parallel()
	b := setupEstimate(t)
	body := `{"model":"gpt-4o","max_tokens":50,"messages":[{"role":"user","content":"hello there"}]}`
	want, err := estimator.New(nil).Estimate(parsed(t, body))
	if err != nil {
		t.Fatal(err)
	}
	got, err := b.a.Quote(parsed(t, body))
	if err != nil || got != want {
		t.Fatalf("quote %+v, %v; want %+v", got, err, want)
	}
	if _, err := b.a.Quote(parsed(t, `{"model":"gpt-4o","max_tokens":100000000,"messages":[{"role":"user","content":"hi"}]}`)); err == nil {
		t.Fatal("a quote past the model's output limit was not refused")
	}
	for _, face := range []admission.Face{admission.FaceAPI, admission.FaceProxy} {
		for _, outcome := range []string{admission.OutcomeAdmitted, admission.OutcomeInvalid} {
			if got := testutil.ToFloat64(b.a.Admissions(face, outcome, "")); got != 0 {
				t.Fatalf("%s %s admissions %v, want none", face, outcome, got)
			}
		}
	}
}

// TestCountOutput: streamed text is counted as its request's estimate
// counted its texts: a Messages or Gemini call's in o200k_base times the
// factor its estimate carries, any other's with its model's encoding.
func TestCountOutput(t *testing.T) {
	t.Parallel()
	a := admission.New(admission.Config{Store: account.NewStore(nil)})
	const text = "The quick brown fox jumps over the lazy dog."
	o200k, err := estimator.CountText(estimator.EncodingO200K, text)
	if err != nil {
		t.Fatal(err)
	}
	cl100k, err := estimator.CountText(estimator.EncodingCL100K, text)
	if err != nil {
		t.Fatal(err)
	}
	est := estimator.New(nil)
	estimate := func(r *estimator.Request, err error) estimator.Estimate {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		e, err := est.Estimate(r)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	claude := estimate(estimator.ParseMessages([]byte(`{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`)))
	unknown := estimate(estimator.ParseMessages([]byte(`{"model":"claude-x","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`)))
	gemini := estimate(estimator.ParseGemini("gemini-2.5-flash", []byte(`{"contents":[{"parts":[{"text":"hi"}]}],"generationConfig":{"maxOutputTokens":10}}`)))
	for _, tc := range []struct {
		name string
		est  estimator.Estimate
		want int64
	}{
		{"gpt-4o", estimator.Estimate{Model: "gpt-4o", Family: "gpt-4o"}, int64(o200k)},
		{"gpt-4", estimator.Estimate{Model: "gpt-4", Family: "gpt-4"}, int64(cl100k)},
		{"older claude", claude, (int64(o200k)*estimator.MessagesSafetyFactorMilli(claude.Family) + 999) / 1000},
		{"unknown claude", unknown, (int64(o200k)*1625 + 999) / 1000},
		{"gemini", gemini, (int64(o200k)*estimator.GeminiSafetyFactorMilli + 999) / 1000},
	} {
		if got := a.CountOutput(tc.est, text); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
	if claude.TextFactorMilli != 1250 || gemini.TextFactorMilli != estimator.GeminiSafetyFactorMilli {
		t.Errorf("text factors: claude %d, gemini %d", claude.TextFactorMilli, gemini.TextFactorMilli)
	}
	if got := a.CountOutput(estimator.Estimate{Model: "gpt-4o"}, ""); got != 0 {
		t.Errorf("no text counted %d, want 0", got)
	}
}

// TestSettleReportedClamps: usage an upstream reported beyond what the
// request reserved is settled at the bound, and says so; usage within it
// is settled as reported.
func TestSettleReportedClamps(t *testing.T) {
	t.Parallel()
	b := setupEstimate(t)
	admit := func() (*account.Reservation, estimator.Estimate) {
		t.Helper()
		ad, err := b.a.Admit(ctx, admission.AdmitRequest{
			Parsed:  parsed(t, `{"model":"gpt-4o","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}`),
			Request: admission.Request{Face: admission.FaceProxy, ReserveParams: account.ReserveParams{TenantID: "acme"}}})
		if err != nil {
			t.Fatal(err)
		}
		return ad.Reservation, ad.Estimate
	}
	for _, tc := range []struct {
		name     string
		reported rule.Usage
		want     rule.Usage
		clamped  bool
	}{
		{"within", rule.Usage{Input: 7, Output: 40}, rule.Usage{Input: 7, Output: 40}, false},
		{"output past the reservation", rule.Usage{Input: 7, Output: 1_000_000}, rule.Usage{Input: 7, Output: 100}, true},
	} {
		r, est := admit()
		clamped, err := b.a.SettleReported(ctx, admission.FaceProxy, est, tc.reported,
			account.SettleParams{TenantID: "acme", AdmissionID: r.AdmissionID})
		if err != nil || clamped != tc.clamped {
			t.Fatalf("%s: clamped %v, %v; want %v", tc.name, clamped, err, tc.clamped)
		}
		got, err := b.store.AdmissionGet(ctx, "acme", r.AdmissionID)
		if err != nil {
			t.Fatal(err)
		}
		if got.ActualInput == nil || got.ActualOutput == nil || *got.ActualInput != tc.want.Input || *got.ActualOutput != tc.want.Output {
			t.Fatalf("%s: settled %v/%v, want %d/%d", tc.name, got.ActualInput, got.ActualOutput, tc.want.Input, tc.want.Output)
		}
	}
}
