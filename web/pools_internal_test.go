package web

import (
	"math"
	"net/url"
	"slices"
	"testing"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

func TestWholeTokens(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ micro, want int64 }{
		{0, 0}, {999_999, 0}, {1_000_000, 1}, {91_500_000, 91}, {-1, -1}, {-1_000_000, -1}, {-1_000_001, -2},
	} {
		if got := wholeTokens(tc.micro); got != tc.want {
			t.Errorf("wholeTokens(%d) = %d, want %d", tc.micro, got, tc.want)
		}
	}
}

func TestSharePct(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		part, whole int64
		want        string
	}{
		{60, 180, "33.3%"}, {120, 180, "66.7%"}, // rounded, not cut: 1:2 reads 33.3 and 66.7
		{0, 180, "0.0%"}, {180, 180, "100.0%"}, {1, 3000, "0.0%"}, {2, 3000, "0.1%"},
		{0, 0, "—"}, {-5, 10, "0.0%"},
		{math.MaxInt64, math.MaxInt64, "100.0%"}, {math.MaxInt64 / 3, math.MaxInt64, "33.3%"}, // part * 1000 is beyond int64
	} {
		if got := sharePct(tc.part, account.NewTotal(tc.whole)); got != tc.want {
			t.Errorf("sharePct(%d, %d) = %q, want %q", tc.part, tc.whole, got, tc.want)
		}
	}
}

func TestModelLimitRows(t *testing.T) {
	t.Parallel()
	rows := modelLimitRows([]rule.ModelSnapshot{
		{Limits: rule.ModelLimits{Model: "gpt-4o", InputCapacity: 100, InputRateMicro: 2_500_000, OutputCapacity: 500, OutputRateMicro: 10_000_000,
			Shadow: rule.LimitSet(0).With(rule.LimitOutputTokens)}, InputMicro: 91_400_000, OutputMicro: 40_000_000},
		{Limits: rule.ModelLimits{Model: "org/llama", OutputCapacity: 50, OutputRateMicro: 1}, OutputMicro: -3_000_000},
	})
	type bucket struct {
		Set          bool
		Text, Pct    string
		Level, Rate  string
		Shadow, Name string
	}
	of := func(b bucketView) bucket {
		s := ""
		if b.Gauge.Shadow {
			s = "shadow"
		}
		return bucket{b.Gauge.Set, b.Gauge.Text, b.Gauge.Pct, b.Gauge.Level, b.Rate, s, b.Gauge.Name}
	}
	want := [][3]any{
		{"gpt-4o", bucket{true, "91 / 100", "91.0", "ok", "2.5", "", "input"}, bucket{true, "40 / 500", "8.0", "warn", "10", "shadow", "output"}},
		{"org/llama", bucket{false, "not set", "0", "ok", "", "", "input"}, bucket{true, "-3 / 50", "0", "bad", "0.000001", "", "output"}},
	}
	if len(rows) != len(want) {
		t.Fatalf("%d rows, want %d", len(rows), len(want))
	}
	for i, w := range want {
		if got := [3]any{rows[i].Model, of(rows[i].Input), of(rows[i].Output)}; got != w {
			t.Errorf("row %d: %+v, want %+v", i, got, w)
		}
	}
}

func TestModelLimitsForm(t *testing.T) {
	t.Parallel()
	read := func(v url.Values) (rule.ModelLimits, []string) {
		f := formFrom(v, modelLimitFields...)
		l := f.modelLimits()
		return l, f.Problems()
	}
	for _, tc := range []struct {
		name string
		in   url.Values
		want []string
	}{
		{"no model", url.Values{"input_tokens_capacity": {"10"}, "input_tokens_per_second": {"1"}}, []string{"model: is required"}},
		{"no bucket", url.Values{"model": {"gpt-4o"}}, []string{"input_tokens_capacity: set an input or an output bucket (or both)"}},
		{"a capacity without its rate", url.Values{"model": {"gpt-4o"}, "output_tokens_capacity": {"10"}},
			[]string{"output_tokens_per_second: output_tokens_capacity and output_tokens_per_second are set together, and the rate is at most 1e9"}},
		{"not a number", url.Values{"model": {"gpt-4o"}, "input_tokens_capacity": {"ten"}, "input_tokens_per_second": {"1"}},
			[]string{"input_tokens_capacity: must be a whole number, 0 or more"}},
		{"a shadow bucket that is not set", url.Values{"model": {"gpt-4o"}, "input_tokens_capacity": {"10"}, "input_tokens_per_second": {"1"}, "shadow": {"output_tokens"}},
			[]string{"shadow: a shadow limit must be configured"}},
		{"a tenant's limit as a model's shadow", url.Values{"model": {"gpt-4o"}, "input_tokens_capacity": {"10"}, "input_tokens_per_second": {"1"}, "shadow": {"tokens"}},
			[]string{"shadow: a model's shadow limits are input_tokens and output_tokens"}},
	} {
		if _, got := read(tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("%s: problems %q, want %q", tc.name, got, tc.want)
		}
	}

	// A valid form reads back what modelLimitsForm writes, blank buckets
	// included.
	for _, l := range []rule.ModelLimits{
		{Model: "gpt-4o", InputCapacity: 1_000, InputRateMicro: 2_500_000, OutputCapacity: 4_000, OutputRateMicro: 16_666_667,
			Shadow: rule.LimitSet(0).With(rule.LimitInputTokens).With(rule.LimitOutputTokens)},
		{Model: "org/llama-3.1-70b", OutputCapacity: 20, OutputRateMicro: 1},
	} {
		f := modelLimitsForm(l)
		v := url.Values{}
		for _, n := range modelLimitFields {
			for _, x := range f.List(n) {
				v.Add(n, x)
			}
		}
		got, problems := read(v)
		if len(problems) != 0 || got != l {
			t.Errorf("round trip of %+v: %+v %q", l, got, problems)
		}
	}

	snaps := []rule.ModelSnapshot{{Limits: rule.ModelLimits{Model: "gpt-4o", InputCapacity: 7, InputRateMicro: 1}}}
	if f := modelLimitsEdit(snaps, "gpt-4o"); f.Get("model") != "gpt-4o" || f.Get("input_tokens_capacity") != "7" {
		t.Errorf("the edit form of gpt-4o: %+v", f.values)
	}
	if f := modelLimitsEdit(snaps, "o3"); f.Get("model") != "" {
		t.Errorf("the edit form of a model without limits: %+v", f.values)
	}
}

func TestPoolCards(t *testing.T) {
	t.Parallel()
	cards := poolCards([]rule.PoolSnapshot{
		{ID: "gpu", Limits: rule.PoolLimits{TokensCapacity: 1_000, TokensRateMicro: 500_000}, TokensMicro: 820_500_000, Models: []string{"gpt-4o"},
			Shares: []rule.PoolShare{{TenantID: "acme", Weight: 1, VTCMicro: 60_000_000, Served: 60}, {TenantID: "globex", Weight: 2, VTCMicro: 120_000_000, Served: 120}}},
		{ID: "idle", Limits: rule.PoolLimits{TokensCapacity: 10, TokensRateMicro: 1}, TokensMicro: 0,
			Shares: []rule.PoolShare{{TenantID: "acme", Weight: 3}}},
	})
	if len(cards) != 2 {
		t.Fatalf("%d cards", len(cards))
	}
	gpu, idle := cards[0], cards[1]
	if gpu.ID != "gpu" || gpu.Prefix != "pool-gpu" || gpu.Tokens.Text != "820 / 1,000" || gpu.Tokens.Pct != "82.0" || gpu.Rate != "0.5" ||
		gpu.ServedTotal.Cmp(account.NewTotal(180)) != 0 || !slices.Equal(gpu.Models, []string{"gpt-4o"}) {
		t.Errorf("gpu: %+v", gpu)
	}
	if want := []shareRow{
		{TenantID: "acme", Weight: 1, WeightPct: "33.3%", Served: 60, ServedPct: "33.3%", Counter: 60_000_000},
		{TenantID: "globex", Weight: 2, WeightPct: "66.7%", Served: 120, ServedPct: "66.7%", Counter: 120_000_000},
	}; !slices.Equal(gpu.Shares, want) {
		t.Errorf("gpu's shares: %+v", gpu.Shares)
	}
	if gpu.Limits.Get("tokens_capacity") != "1000" || gpu.Limits.Get("tokens_per_second") != "0.5" || gpu.Route.Get("model") != "" {
		t.Errorf("gpu's forms: %+v %+v", gpu.Limits.values, gpu.Route.values)
	}
	if want := []shareRow{{TenantID: "acme", Weight: 3, WeightPct: "100.0%", ServedPct: "—"}}; !slices.Equal(idle.Shares, want) || idle.Tokens.Level != "bad" {
		t.Errorf("idle: %+v %+v", idle.Shares, idle.Tokens)
	}

	for _, tc := range []struct {
		capacity, rate string
		want           []string
	}{
		{"1000", "0.5", nil},
		{"", "1", []string{"tokens_capacity: is required"}},
		{"0", "1", []string{"tokens_capacity: must be between 1 and 1000000000000"}},
		{"10", "0", []string{"tokens_per_second: must be greater than 0 (and at most 1e9)"}},
	} {
		f := formFrom(url.Values{"tokens_capacity": {tc.capacity}, "tokens_per_second": {tc.rate}}, "tokens_capacity", "tokens_per_second")
		f.poolLimits()
		if got := f.Problems(); !slices.Equal(got, tc.want) {
			t.Errorf("pool limits %s at %s: %q, want %q", tc.capacity, tc.rate, got, tc.want)
		}
	}
}

// TestSumsNearInt64: the pools page's served total and the tenant page's
// cost chart sum values near int64's end exactly, and their shares and
// axes neither overflow nor loop.
func TestSumsNearInt64(t *testing.T) {
	t.Parallel()
	cards := poolCards([]rule.PoolSnapshot{{ID: "gpu", Limits: rule.PoolLimits{TokensCapacity: 10, TokensRateMicro: 1},
		Shares: []rule.PoolShare{{TenantID: "a", Weight: math.MaxInt64, Served: math.MaxInt64}, {TenantID: "b", Weight: math.MaxInt64, Served: math.MaxInt64}}}})
	gpu := cards[0]
	if gpu.ServedTotal.String() != "18446744073709551614" || gpu.Shares[0].ServedPct != "50.0%" || gpu.Shares[1].WeightPct != "50.0%" {
		t.Errorf("served total %s, shares %+v", gpu.ServedTotal, gpu.Shares)
	}
	for _, v := range []int64{1, 7, 5_000_000_000_000_000_000, 5_000_000_000_000_000_001, math.MaxInt64} {
		if got := niceCeil(v); got < v || v < 1e17 && got > 10*v {
			t.Errorf("niceCeil(%d) = %d", v, got)
		}
	}
	if got := pct(math.MaxInt64-1, math.MaxInt64); got != "99.9" {
		t.Errorf("pct near int64's end: %s", got)
	}
	if g := balanceGauge("tokens", math.MaxInt64/2, math.MaxInt64); g.Level != "ok" || g.Pct != "49.9" {
		t.Errorf("gauge near int64's end: %+v", g)
	}
	if g := openGauge(math.MaxInt64/10*9, math.MaxInt64); g.Level != "warn" {
		t.Errorf("open gauge near int64's end: %+v", g)
	}
	est := int64(1)
	big, small := int64(math.MaxInt64), int64(math.MaxInt64-1)
	ch := newCostChart([]*account.Admission{
		{ID: "adm_1", Estimate: estimator.Estimate{Model: "m", Cost: est}, ActualCost: &big},
		{ID: "adm_2", Estimate: estimator.Estimate{Model: "m", Cost: est}, ActualCost: &small},
	})
	if ch.SumActual.String() != "18446744073709551613" || ch.SumEstimate.String() != "2" || ch.Ratio() != "0.00" ||
		ch.Ticks[4].Label != "9,223,372,036,854,775,807" || ch.Ticks[2].Y != "114.0" {
		t.Errorf("chart near int64's end: sums %s %s, ratio %s, ticks %+v", ch.SumEstimate, ch.SumActual, ch.Ratio(), ch.Ticks)
	}
}
