package estimator_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tokengate/tokengate/estimator"
	"github.com/tokengate/tokengate/integration/pgtest"
)

// TestReadServiceTier: each provider's words, in requests and responses,
// map onto the price tiers; words that name no per-token price are "".
func TestReadServiceTier(t *testing.T) {
	t.Parallel()
	for word, want := range map[string]string{
		"default": "default", "flex": "flex", "priority": "priority", "batch": "batch", // OpenAI, ours
		"standard":  "default",                                                             // Anthropic's usage
		"ON_DEMAND": "default", "ON_DEMAND_FLEX": "flex", "ON_DEMAND_PRIORITY": "priority", // Vertex trafficType
		" Priority ": "priority",
		"auto":       "", "standard_only": "", "scale": "", "PROVISIONED_THROUGHPUT": "", "": "", "bogus": "",
	} {
		if got := estimator.ReadServiceTier(word); got != want {
			t.Errorf("ReadServiceTier(%q) = %q, want %q", word, got, want)
		}
	}
}

// TestRequestServiceTier: the tier a request asks for is the estimate's,
// in OpenAI's and Anthropic's bodies; "auto" and absent are the default
// (""); a service_tier that is no string is refused, naming it.
func TestRequestServiceTier(t *testing.T) {
	t.Parallel()
	e := estimator.New(nil)
	for _, tc := range []struct {
		body      string
		anthropic bool
		want      string
	}{
		{`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"service_tier":"flex"}`, false, "flex"},
		{`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"service_tier":"priority"}`, false, "priority"},
		{`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"service_tier":"auto"}`, false, ""},
		{`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"service_tier":"default"}`, false, ""},
		{`{"model":"gpt-4o","input":"hi"}`, false, ""},
		{`{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[{"role":"user","content":"hi"}],"service_tier":"auto"}`, true, ""},
		{`{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[{"role":"user","content":"hi"}],"service_tier":"standard_only"}`, true, ""},
	} {
		parse := estimator.Parse
		if tc.anthropic {
			parse = estimator.ParseMessages
		}
		r, err := parse([]byte(tc.body))
		if err != nil {
			t.Fatalf("%s: %v", tc.body, err)
		}
		est, err := e.Estimate(r)
		if err != nil || est.ServiceTier != tc.want {
			t.Errorf("%s: tier %q (%v), want %q", tc.body, est.ServiceTier, err, tc.want)
		}
	}
	_, openAIErr := estimator.Parse([]byte(`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"service_tier":1}`))
	_, anthropicErr := estimator.ParseMessages([]byte(`{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[{"role":"user","content":"hi"}],"service_tier":["flex"]}`))
	for _, err := range []error{openAIErr, anthropicErr} {
		var inv *estimator.InvalidError
		if !errors.As(err, &inv) || inv.Field != "service_tier" {
			t.Errorf("%v, want an error naming service_tier", err)
		}
	}
}

// TestPriceBookTiers: a tier's row prices that tier; a tier with no row
// in effect at the time asked falls back to the default tier's row in
// effect then, whatever the tier's later rows; ExactTier answers only the
// row named.
func TestPriceBookTiers(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	t1 := t0.Add(24 * time.Hour)
	book := estimator.NewPriceBook([]estimator.Price{
		{Model: "gpt-4o", EffectiveFrom: t0, InputMicro: 2_500_000, OutputMicro: 10_000_000},
		{Model: "gpt-4o", ServiceTier: "flex", EffectiveFrom: t1, InputMicro: 1_250_000, OutputMicro: 5_000_000},
		{Model: "gpt-4o", ServiceTier: "priority", EffectiveFrom: t0, InputMicro: 5_000_000, OutputMicro: 20_000_000},
		{Model: "flex-only", ServiceTier: "flex", EffectiveFrom: t0, InputMicro: 1, OutputMicro: 1},
	})
	for _, tc := range []struct {
		model, tier string
		at          time.Time
		input       int64 // 0: no price
		rowTier     string
	}{
		{"gpt-4o-2024-08-06", "", t0, 2_500_000, ""},
		{"gpt-4o", "default", t1, 2_500_000, ""},
		{"gpt-4o", "priority", t0, 5_000_000, "priority"},
		{"gpt-4o", "flex", t0, 2_500_000, ""}, // no flex row yet: the default's
		{"gpt-4o", "flex", t1, 1_250_000, "flex"},
		{"gpt-4o", "batch", t1, 2_500_000, ""},
		{"gpt-4o", "bogus", t1, 2_500_000, ""},
		{"gpt-4o", "priority", t0.Add(-time.Second), 0, ""},
		{"flex-only", "flex", t0, 1, "flex"},
		{"flex-only", "", t0, 0, ""}, // no default row to fall back to
		{"flex-only", "priority", t0, 0, ""},
	} {
		p, ok := book.AtTier(tc.model, tc.tier, tc.at)
		if got := map[bool]int64{true: p.InputMicro}[ok]; got != tc.input || (ok && p.ServiceTier != tc.rowTier) {
			t.Errorf("AtTier(%s, %q, %v) = %d at %q (%v), want %d at %q", tc.model, tc.tier, tc.at, p.InputMicro, p.ServiceTier, ok, tc.input, tc.rowTier)
		}
	}
	if p, ok := book.ExactTier("gpt-4o", "flex", t1); !ok || p.InputMicro != 1_250_000 {
		t.Errorf("ExactTier flex: %+v %v", p, ok)
	}
	if _, ok := book.ExactTier("gpt-4o", "batch", t0); ok {
		t.Error("ExactTier answered a tier with no row")
	}
	if p, ok := book.Exact("gpt-4o", t0); !ok || p.InputMicro != 2_500_000 {
		t.Errorf("Exact: %+v %v", p, ok)
	}
}

// TestPriceTiersStored: a row per model, tier and time; the default tier
// when none is named; a tier the table does not know is refused naming
// service_tier; listing filters by tier; an import keyed by model and
// tier adds each tier's row once.
func TestPriceTiersStored(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.New(t, nil)
	t0 := time.Now().Add(time.Hour).Truncate(time.Microsecond)
	for _, p := range []estimator.Price{
		{Model: "m", EffectiveFrom: t0, Currency: "USD", InputMicro: 2, OutputMicro: 8, CreatedBy: "a"},
		{Model: "m", ServiceTier: "flex", EffectiveFrom: t0, Currency: "USD", InputMicro: 1, OutputMicro: 4, CreatedBy: "a"},
		{Model: "m", ServiceTier: "priority", EffectiveFrom: t0, Currency: "USD", InputMicro: 4, OutputMicro: 16, CreatedBy: "a"},
	} {
		if _, err := estimator.PriceInsert(ctx, pool, p); err != nil {
			t.Fatal(err)
		}
	}
	var inv *estimator.InvalidError
	_, err := estimator.PriceInsert(ctx, pool, estimator.Price{Model: "m", ServiceTier: "flex", EffectiveFrom: t0, Currency: "USD", CreatedBy: "a"})
	if !errors.As(err, &inv) || inv.Field != "effective_from" {
		t.Fatalf("a tier's time twice: %v", err)
	}
	_, err = estimator.PriceInsert(ctx, pool, estimator.Price{Model: "m", ServiceTier: "scale", Currency: "USD", CreatedBy: "a"})
	if !errors.As(err, &inv) || inv.Field != "service_tier" {
		t.Fatalf("an unknown tier: %v", err)
	}
	all, err := estimator.PriceList(ctx, pool, "", "", t0)
	if err != nil || len(all) != 3 || all[0].ServiceTier != "default" || all[1].ServiceTier != "flex" || all[2].ServiceTier != "priority" {
		t.Fatalf("list: %+v %v", all, err)
	}
	if flex, err := estimator.PriceList(ctx, pool, "m", "flex", t0); err != nil || len(flex) != 1 || flex[0].InputMicro != 1 {
		t.Fatalf("list of flex: %+v %v", flex, err)
	}
	if p, err := estimator.PriceAtTier(ctx, pool, "m", "priority", t0); err != nil || p.InputMicro != 4 {
		t.Fatalf("PriceAtTier: %+v %v", p, err)
	}
	if _, err := estimator.PriceAtTier(ctx, pool, "m", "batch", t0); !errors.Is(err, estimator.ErrNoPrice) {
		t.Fatalf("PriceAtTier of a tier with no row: %v", err)
	}

	f, err := estimator.ParsePriceFile([]byte(`{"version":"t","providers":[{"provider":"x","source":"s","taken":"today","models":[
		{"model":"n","input":"2","output":"8"},{"model":"n","service_tier":"flex","input":"1","output":"4"}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []int{2, 0} {
		res, err := estimator.PriceImport(ctx, pool, f, "cli")
		if err != nil || len(res.Inserted) != want {
			t.Fatalf("import %d: %+v %v", i, res, err)
		}
	}
	if _, err := estimator.ParsePriceFile([]byte(`{"version":"t","providers":[{"provider":"x","source":"s","taken":"today","models":[
		{"model":"n","service_tier":"flex","input":"2","output":"8"},{"model":"n","service_tier":"flex","input":"1","output":"4"}]}]}`)); err == nil {
		t.Fatal("a file pricing one model's tier twice was accepted")
	}
	if _, err := estimator.ParsePriceFile([]byte(`{"version":"t","providers":[{"provider":"x","source":"s","taken":"today","models":[
		{"model":"n","service_tier":"scale","input":"2","output":"8"}]}]}`)); err == nil {
		t.Fatal("a file pricing an unknown tier was accepted")
	}
}

// FuzzPriceBookTier: whatever rows and question, AtTier never panics and
// answers what a scan of the rows answers: the tier's latest row not
// after t, else the default tier's.
func FuzzPriceBookTier(f *testing.F) {
	f.Add([]byte{0, 0, 1, 5, 2, 3}, uint8(1), int64(4))
	f.Add([]byte{1, 9, 3, 2, 0, 10}, uint8(3), int64(9))
	f.Add([]byte{}, uint8(7), int64(0))
	f.Fuzz(func(t *testing.T, spec []byte, tierByte uint8, at int64) {
		t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		words := append([]string{""}, estimator.ServiceTiers...)
		var rows []estimator.Price
		seen := map[[2]int64]bool{}
		for i := 0; i+1 < len(spec) && len(rows) < 32; i += 2 {
			tier, from := int64(spec[i]%5), int64(spec[i+1]%16)
			key := [2]int64{max(tier, 1), from} // "" and default are one tier
			if seen[key] {
				continue // the table's key
			}
			seen[key] = true
			rows = append(rows, estimator.Price{Model: "m", ServiceTier: words[tier], EffectiveFrom: t0.Add(time.Duration(from) * time.Hour), InputMicro: int64(i)})
		}
		tier := words[int(tierByte)%len(words)]
		if tierByte >= 200 {
			tier = "unknown"
		}
		when := t0.Add(time.Duration(at%20) * time.Hour)
		got, ok := estimator.NewPriceBook(rows).AtTier("m", tier, when)
		want, wantOK := scanTier(rows, estimator.TierOr(tier), when)
		if !wantOK {
			want, wantOK = scanTier(rows, estimator.TierDefault, when)
		}
		if ok != wantOK || (ok && got.InputMicro != want.InputMicro) {
			t.Fatalf("AtTier(%q, %v) = %+v %v, want %+v %v", tier, when, got, ok, want, wantOK)
		}
	})
}

func scanTier(rows []estimator.Price, tier string, at time.Time) (estimator.Price, bool) {
	var best estimator.Price
	ok := false
	for _, r := range rows {
		if estimator.TierOr(r.ServiceTier) == tier && !r.EffectiveFrom.After(at) && (!ok || r.EffectiveFrom.After(best.EffectiveFrom)) {
			best, ok = r, true
		}
	}
	return best, ok
}

// TestPriceBookAtBatch: a batch line is priced at the model's 'batch' row
// where one is in effect, else at the default row at BatchDiscountPercent
// (every part, rounded up), never at the default row's full price.
func TestPriceBookAtBatch(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	t1 := t0.Add(24 * time.Hour)
	cached, lin, lout, th := int64(1_250_001), int64(5_000_000), int64(15_000_000), int64(200_000)
	book := estimator.NewPriceBook([]estimator.Price{
		{Model: "gpt-4o", EffectiveFrom: t0, InputMicro: 2_500_000, OutputMicro: 10_000_001, CachedInputMicro: &cached,
			LongContextThreshold: &th, LongInputMicro: &lin, LongOutputMicro: &lout},
		{Model: "gpt-4o", ServiceTier: "batch", EffectiveFrom: t1, InputMicro: 1_000_000, OutputMicro: 4_000_000},
	})
	p, ok := book.AtBatch("gpt-4o", t0)
	if !ok || p.InputMicro != 1_250_000 || p.OutputMicro != 5_000_001 || *p.CachedInputMicro != 625_001 ||
		*p.LongInputMicro != 2_500_000 || *p.LongOutputMicro != 7_500_000 || *p.LongContextThreshold != th || p.ServiceTier != "batch" {
		t.Fatalf("AtBatch without a batch row: %+v %v", p, ok)
	}
	if cached != 1_250_001 {
		t.Fatal("AtBatch changed the book's row")
	}
	if d, _ := book.AtTier("gpt-4o", "default", t0); d.InputMicro != 2_500_000 {
		t.Fatalf("the default row after AtBatch: %+v", d)
	}
	if p, ok := book.AtBatch("gpt-4o-2024-08-06", t1); !ok || p.InputMicro != 1_000_000 || p.OutputMicro != 4_000_000 {
		t.Fatalf("AtBatch with a batch row: %+v %v", p, ok)
	}
	if _, ok := book.AtBatch("gpt-4o", t0.Add(-time.Second)); ok {
		t.Fatal("AtBatch priced a model before any row")
	}
	if _, ok := book.AtBatch("no-such-model", t1); ok {
		t.Fatal("AtBatch priced an unknown model")
	}
}
