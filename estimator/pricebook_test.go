package estimator_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/big"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tokengate/tokengate/estimator"
	"github.com/tokengate/tokengate/integration/pgtest"
)

// TestPriceCost: each part at its price, nil prices falling back, the sum
// rounded up once, the long-context tier on the whole call, and the
// int64 bound.
func TestPriceCost(t *testing.T) {
	t.Parallel()
	gpt4o := estimator.Price{Model: "gpt-4o", InputMicro: 2_500_000, CachedInputMicro: ptr(1_250_000), OutputMicro: 10_000_000}
	sonnet := estimator.Price{Model: "claude-sonnet-4-5", InputMicro: 3_000_000, CachedInputMicro: ptr(300_000),
		CacheWrite5mMicro: ptr(3_750_000), CacheWrite1hMicro: ptr(6_000_000), OutputMicro: 15_000_000}
	bare := estimator.Price{Model: "bare", InputMicro: 1_000_000, OutputMicro: 2_000_000}
	only5m := estimator.Price{Model: "only5m", InputMicro: 1_000_000, CacheWrite5mMicro: ptr(3_000_000), OutputMicro: 2_000_000}
	reasoning := estimator.Price{Model: "r", InputMicro: 1_000_000, OutputMicro: 2_000_000, ReasoningOutputMicro: ptr(5_000_000)}
	gemini := estimator.Price{Model: "gemini-2.5-pro", InputMicro: 1_250_000, OutputMicro: 10_000_000,
		LongContextThreshold: ptr(200_000), LongInputMicro: ptr(2_500_000), LongOutputMicro: ptr(15_000_000)}
	// Anthropic's 1M tier: twice the input, 1.5 times the output; a cache
	// read stays a tenth of an input token.
	sonnetLong := sonnet
	sonnetLong.LongContextThreshold, sonnetLong.LongInputMicro, sonnetLong.LongOutputMicro = ptr(200_000), ptr(6_000_000), ptr(22_500_000)
	// A ratio that is no integer: a cache read at 1/3 of input, long input
	// at 7/3: three long cache reads cost exactly 7, not 3*ceil(7/3).
	thirds := estimator.Price{Model: "thirds", InputMicro: 3_000_000, CachedInputMicro: ptr(1_000_000), OutputMicro: 1,
		LongContextThreshold: ptr(2), LongInputMicro: ptr(7_000_000), LongOutputMicro: ptr(1)}
	freeInput := estimator.Price{Model: "free", InputMicro: 0, CachedInputMicro: ptr(5_000_000), OutputMicro: 0,
		ReasoningOutputMicro: ptr(4_000_000), LongContextThreshold: ptr(1), LongInputMicro: ptr(10_000_000), LongOutputMicro: ptr(20_000_000)}
	maxPrice := estimator.Price{Model: "max", InputMicro: 1_000_000, OutputMicro: 1}

	for _, tc := range []struct {
		name  string
		price estimator.Price
		u     estimator.MoneyUsage
		want  int64
	}{
		{"nothing", gpt4o, estimator.MoneyUsage{}, 0},
		// 600*2.5 + 400*1.25 + 400*10 + 100*10 (reasoning as output).
		{"gpt-4o parts", gpt4o, estimator.MoneyUsage{Input: 1000, CachedRead: 400, Output: 500, Reasoning: 100}, 7000},
		// 2000*3 + 5000*0.3 + 2000*3.75 + 1000*6 + 1000*15.
		{"sonnet cache", sonnet, estimator.MoneyUsage{Input: 10_000, CachedRead: 5000, CacheWrite5m: 2000, CacheWrite1h: 1000, Output: 1000}, 36_000},
		{"one token rounds up", gpt4o, estimator.MoneyUsage{Input: 1}, 3},
		{"a cached token rounds up", gpt4o, estimator.MoneyUsage{Input: 1, CachedRead: 1}, 2},
		{"rounded once, not per part", gpt4o, estimator.MoneyUsage{Input: 2, CachedRead: 1}, 4}, // 2.5+1.25 = 3.75
		{"exact needs no rounding", gpt4o, estimator.MoneyUsage{Input: 2}, 5},
		{"a micro per million", estimator.Price{InputMicro: 1}, estimator.MoneyUsage{Input: 1}, 1},
		{"a million at a micro per million", estimator.Price{InputMicro: 1}, estimator.MoneyUsage{Input: 1_000_000}, 1},
		{"a million and one at a micro", estimator.Price{InputMicro: 1}, estimator.MoneyUsage{Input: 1_000_001}, 2},
		{"nil cached is input", bare, estimator.MoneyUsage{Input: 10, CachedRead: 10}, 10},
		{"nil 5m write is input", bare, estimator.MoneyUsage{Input: 10, CacheWrite5m: 10}, 10},
		{"nil 1h write is input without a 5m price", bare, estimator.MoneyUsage{Input: 10, CacheWrite1h: 10}, 10},
		{"nil 1h write is the 5m write", only5m, estimator.MoneyUsage{Input: 10, CacheWrite1h: 10}, 30},
		{"nil reasoning is output", bare, estimator.MoneyUsage{Output: 10, Reasoning: 10}, 20},
		{"reasoning priced apart", reasoning, estimator.MoneyUsage{Output: 10, Reasoning: 4}, 6*2 + 4*5},
		{"at the threshold: standard", gemini, estimator.MoneyUsage{Input: 200_000, Output: 1000}, 250_000 + 10_000},
		// 200001*2.5 + 1000*15 = 515002.5
		{"above the threshold: the whole call long", gemini, estimator.MoneyUsage{Input: 200_001, Output: 1000}, 515_003},
		{"cache parts count toward the threshold", gemini, estimator.MoneyUsage{Input: 200_001, CachedRead: 200_001}, 500_003},
		// (200000*3 + 100000*0.3) * 6/3 + 1000*22.5
		{"long cache read keeps its ratio", sonnetLong, estimator.MoneyUsage{Input: 300_000, CachedRead: 100_000, Output: 1000}, 1_282_500},
		// (1000*3.75 + 1000*6 + 198001*3) * 2 = 1207506; reasoning at 22.5.
		{"long cache writes", sonnetLong, estimator.MoneyUsage{Input: 200_001, CacheWrite5m: 1000, CacheWrite1h: 1000, Output: 10, Reasoning: 10}, 1_207_506 + 225},
		{"long ratio exact", thirds, estimator.MoneyUsage{Input: 3, CachedRead: 3}, 7},
		{"long ratio exact with uncached input", thirds, estimator.MoneyUsage{Input: 4, CachedRead: 3}, 14},
		{"long ratio rounded up once", thirds, estimator.MoneyUsage{Input: 3, CachedRead: 2}, 12}, // 35/3
		// Input at 0: uncached takes the long price, the cache read keeps
		// its own; output at 0: output long, reasoning its own.
		{"long from a zero price", freeInput, estimator.MoneyUsage{Input: 3, CachedRead: 1, Output: 3, Reasoning: 1}, 2*10 + 5 + 2*20 + 4},
		{"largest cost", maxPrice, estimator.MoneyUsage{Input: math.MaxInt64}, math.MaxInt64},
		{"largest cost from parts", estimator.Price{InputMicro: 999_999, OutputMicro: 1_000_000},
			estimator.MoneyUsage{Input: math.MaxInt64, Output: 1}, 9_223_362_813_482_738_954}, // ceil((2^63-1)*0.999999 + 1)
	} {
		got, err := tc.price.Cost(tc.u)
		if err != nil || got != tc.want {
			t.Errorf("%s: Cost(%+v) = %d, %v; want %d", tc.name, tc.u, got, err, tc.want)
		}
		if ref, ok := referenceCost(&tc.price, tc.u); !ok || ref.Cmp(big.NewInt(got)) != 0 {
			t.Errorf("%s: reference %v, Cost %d", tc.name, ref, got)
		}
	}

	for _, tc := range []struct {
		name  string
		price estimator.Price
		u     estimator.MoneyUsage
	}{
		{"one micro past the bound", maxPrice, estimator.MoneyUsage{Input: math.MaxInt64, Output: 1}},
		{"a price past the bound", estimator.Price{InputMicro: 1_000_001}, estimator.MoneyUsage{Input: math.MaxInt64}},
		{"largest price and tokens", estimator.Price{InputMicro: math.MaxInt64, OutputMicro: math.MaxInt64},
			estimator.MoneyUsage{Input: math.MaxInt64, Output: math.MaxInt64}},
		{"long tier past the bound", estimator.Price{InputMicro: 1, OutputMicro: 1, LongContextThreshold: ptr(1),
			LongInputMicro: ptr(1_000_000_000_000), LongOutputMicro: ptr(1)}, estimator.MoneyUsage{Input: 1 << 62}},
	} {
		got, err := tc.price.Cost(tc.u)
		if !errors.Is(err, estimator.ErrMoneyOverflow) || errors.Is(err, estimator.ErrInvalid) {
			t.Errorf("%s: Cost = %d, %v; want ErrMoneyOverflow", tc.name, got, err)
		}
	}

	for _, tc := range []struct {
		name  string
		price estimator.Price
		u     estimator.MoneyUsage
		field string
	}{
		{"negative input", gpt4o, estimator.MoneyUsage{Input: -1}, "input"},
		{"negative cached", gpt4o, estimator.MoneyUsage{Input: 1, CachedRead: -1}, "cached_read"},
		{"negative reasoning", gpt4o, estimator.MoneyUsage{Output: 1, Reasoning: -1}, "reasoning"},
		{"negative output", gpt4o, estimator.MoneyUsage{Output: -1}, "output"},
		{"cached above input", gpt4o, estimator.MoneyUsage{Input: 1, CachedRead: 2}, "cached_read"},
		{"cache parts above input", sonnet, estimator.MoneyUsage{Input: 10, CachedRead: 4, CacheWrite5m: 4, CacheWrite1h: 3}, "cache_write_1h"},
		{"cache parts overflowing", sonnet, estimator.MoneyUsage{Input: math.MaxInt64, CachedRead: math.MaxInt64, CacheWrite5m: math.MaxInt64}, "cache_write_5m"},
		{"reasoning above output", gpt4o, estimator.MoneyUsage{Output: 1, Reasoning: 2}, "reasoning"},
		{"negative price", estimator.Price{InputMicro: -1}, estimator.MoneyUsage{Input: 1}, "input"},
		{"negative long price", estimator.Price{LongContextThreshold: ptr(1), LongInputMicro: ptr(-1), LongOutputMicro: ptr(1)}, estimator.MoneyUsage{}, "long_context"},
	} {
		got, err := tc.price.Cost(tc.u)
		var inv *estimator.InvalidError
		if !errors.As(err, &inv) || inv.Field != tc.field || errors.Is(err, estimator.ErrMoneyOverflow) {
			t.Errorf("%s: Cost = %d, %v; want an *InvalidError on %s", tc.name, got, err, tc.field)
		}
	}
}

// referenceCost is Cost written the slow way, per part, in rationals:
// each part's price (scaled by the long tier's ratio) times its tokens,
// summed, divided by a million and rounded up. ok is false for usage or
// prices Cost must refuse.
func referenceCost(p *estimator.Price, u estimator.MoneyUsage) (*big.Int, bool) {
	if u.Input < 0 || u.CachedRead < 0 || u.CacheWrite5m < 0 || u.CacheWrite1h < 0 || u.Output < 0 || u.Reasoning < 0 || u.Reasoning > u.Output {
		return nil, false
	}
	cache := new(big.Int).Add(big.NewInt(u.CachedRead), big.NewInt(u.CacheWrite5m))
	cache.Add(cache, big.NewInt(u.CacheWrite1h))
	if cache.Cmp(big.NewInt(u.Input)) > 0 {
		return nil, false
	}
	rat := func(v int64) *big.Rat { return new(big.Rat).SetInt64(v) }
	type part struct {
		tokens int64
		price  *big.Rat
		own    bool // a price of its own, not the input's or output's
		output bool
	}
	or := func(v *int64, fallback *big.Rat, fallbackOwn bool) (*big.Rat, bool) {
		if v == nil {
			return fallback, fallbackOwn
		}
		return rat(*v), true
	}
	in, out := rat(p.InputMicro), rat(p.OutputMicro)
	read, readOwn := or(p.CachedInputMicro, in, false)
	w5, w5Own := or(p.CacheWrite5mMicro, in, false)
	w1, w1Own := or(p.CacheWrite1hMicro, w5, w5Own)
	reason, reasonOwn := or(p.ReasoningOutputMicro, out, false)
	for _, r := range []*big.Rat{in, out, read, w5, w1, reason} {
		if r.Sign() < 0 {
			return nil, false
		}
	}
	if (p.LongInputMicro != nil && *p.LongInputMicro < 0) || (p.LongOutputMicro != nil && *p.LongOutputMicro < 0) {
		return nil, false
	}
	parts := []part{
		{u.Input - cache.Int64(), in, false, false}, {u.CachedRead, read, readOwn, false}, {u.CacheWrite5m, w5, w5Own, false},
		{u.CacheWrite1h, w1, w1Own, false}, {u.Output - u.Reasoning, out, false, true}, {u.Reasoning, reason, reasonOwn, true},
	}
	long := p.LongContextThreshold != nil && p.LongInputMicro != nil && p.LongOutputMicro != nil && u.Input > *p.LongContextThreshold
	sum := new(big.Rat)
	for _, pt := range parts {
		price := pt.price
		if long {
			base, longPrice := in, rat(*p.LongInputMicro)
			if pt.output {
				base, longPrice = out, rat(*p.LongOutputMicro)
			}
			switch {
			case base.Sign() > 0:
				price = new(big.Rat).Mul(price, new(big.Rat).Quo(longPrice, base))
			case !pt.own:
				price = longPrice
			}
		}
		sum.Add(sum, new(big.Rat).Mul(rat(pt.tokens), price))
	}
	sum.Quo(sum, rat(1_000_000))
	q, r := new(big.Int).QuoRem(sum.Num(), sum.Denom(), new(big.Int))
	if r.Sign() > 0 {
		q.Add(q, big.NewInt(1))
	}
	return q, true
}

// FuzzPriceCost: Cost never panics, equals the rational reference (or
// refuses what the reference refuses, or overflows where it exceeds
// int64), and never falls when the call uses one more token of any part
// (given long prices not below the standard ones, as every provider's).
func FuzzPriceCost(f *testing.F) {
	f.Add(int64(1000), int64(400), int64(0), int64(0), int64(500), int64(100),
		int64(2_500_000), int64(1_250_000), int64(0), int64(0), int64(10_000_000), int64(0), uint8(1), int64(0), int64(0), int64(0))
	f.Add(int64(300_000), int64(100_000), int64(1000), int64(1000), int64(1000), int64(10),
		int64(3_000_000), int64(300_000), int64(3_750_000), int64(6_000_000), int64(15_000_000), int64(0), uint8(0x0f|0x20), int64(200_000), int64(3_000_000), int64(7_500_000))
	f.Add(int64(3), int64(3), int64(0), int64(0), int64(0), int64(0),
		int64(3_000_000), int64(1_000_000), int64(0), int64(0), int64(1), int64(0), uint8(0x21), int64(2), int64(4_000_000), int64(0))
	f.Add(int64(math.MaxInt64), int64(0), int64(0), int64(0), int64(1), int64(0),
		int64(1_000_000), int64(0), int64(0), int64(0), int64(1), int64(0), uint8(0), int64(0), int64(0), int64(0))
	f.Add(int64(-1), int64(2), int64(0), int64(0), int64(1), int64(2),
		int64(-5), int64(0), int64(0), int64(0), int64(1), int64(0), uint8(0xff), int64(-1), int64(0), int64(0))
	f.Add(int64(5), int64(1), int64(1), int64(1), int64(5), int64(5),
		int64(0), int64(7), int64(9), int64(11), int64(0), int64(13), uint8(0x2f), int64(1), int64(17), int64(19))
	f.Fuzz(func(t *testing.T, in, read, w5, w1, out, reasoning, inP, readP, w5P, w1P, outP, reasonP int64,
		set uint8, threshold, longInExtra, longOutExtra int64) {
		p := estimator.Price{Model: "m", InputMicro: inP, OutputMicro: outP}
		opt := func(bit uint8, v int64) *int64 {
			if set&bit == 0 {
				return nil
			}
			return &v
		}
		p.CachedInputMicro, p.CacheWrite5mMicro, p.CacheWrite1hMicro, p.ReasoningOutputMicro =
			opt(1, readP), opt(2, w5P), opt(4, w1P), opt(8, reasonP)
		if set&0x20 != 0 {
			// Long prices are the standard ones plus an extra, so that
			// crossing the threshold never lowers a price (unless the
			// fuzzer's sums wrap, which the monotonicity check skips).
			li, lo := inP+longInExtra, outP+longOutExtra
			p.LongContextThreshold, p.LongInputMicro, p.LongOutputMicro = &threshold, &li, &lo
		}
		u := estimator.MoneyUsage{Input: in, CachedRead: read, CacheWrite5m: w5, CacheWrite1h: w1, Output: out, Reasoning: reasoning}
		got, err := p.Cost(u)
		ref, ok := referenceCost(&p, u)
		switch {
		case !ok:
			if !errors.Is(err, estimator.ErrInvalid) {
				t.Fatalf("Cost(%+v) at %+v = %d, %v; want an *InvalidError", u, p, got, err)
			}
			return
		case !ref.IsInt64():
			if !errors.Is(err, estimator.ErrMoneyOverflow) {
				t.Fatalf("Cost(%+v) = %d, %v; reference %v overflows", u, got, err, ref)
			}
			return
		case err != nil || ref.Int64() != got:
			t.Fatalf("Cost(%+v) at %+v = %d, %v; reference %v", u, p, got, err, ref)
		}
		monotone := longInExtra >= 0 && longOutExtra >= 0 && (p.LongInputMicro == nil || (*p.LongInputMicro >= inP && *p.LongOutputMicro >= outP))
		if !monotone {
			return
		}
		for _, more := range []estimator.MoneyUsage{
			{Input: 1}, {Input: 1, CachedRead: 1}, {Input: 1, CacheWrite5m: 1}, {Input: 1, CacheWrite1h: 1},
			{Output: 1}, {Output: 1, Reasoning: 1},
		} {
			v := u
			v.Input += more.Input
			v.CachedRead += more.CachedRead
			v.CacheWrite5m += more.CacheWrite5m
			v.CacheWrite1h += more.CacheWrite1h
			v.Output += more.Output
			v.Reasoning += more.Reasoning
			if v.Input < u.Input || v.Output < u.Output {
				continue // wrapped at MaxInt64
			}
			c, err := p.Cost(v)
			if errors.Is(err, estimator.ErrMoneyOverflow) {
				continue
			}
			if err != nil || c < got {
				t.Fatalf("one more token (%+v): Cost(%+v) = %d, %v < Cost(%+v) = %d", more, v, c, err, u, got)
			}
		}
	})
}

// bookRows returns the default price file's rows, effective at from,
// created at created.
func bookRows(t testing.TB, from, created time.Time) []estimator.Price {
	t.Helper()
	f, err := estimator.DefaultPriceFile()
	if err != nil {
		t.Fatal(err)
	}
	ps, err := f.Prices()
	if err != nil {
		t.Fatal(err)
	}
	for i := range ps {
		ps[i].EffectiveFrom, ps[i].CreatedAt = from, created
	}
	return ps
}

// TestPriceBookAtNames: a request's model name finds its price by the
// model table's rule, on the default file's models.
func TestPriceBookAtNames(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	book := estimator.NewPriceBook(bookRows(t, t0, t0))
	now := t0.Add(time.Hour)
	for name, want := range map[string]string{
		"gpt-4o": "gpt-4o", "gpt-4o-2024-08-06": "gpt-4o", "gpt-4o-mini": "gpt-4o-mini",
		"gpt-4o-mini-2024-07-18": "gpt-4o-mini", "gpt-4o-mini-search-preview": "gpt-4o-mini",
		"gpt-4.1-2025-04-14": "gpt-4.1", "gpt-4.1-mini": "gpt-4.1-mini", "gpt-4.1-mini-2025-04-14": "gpt-4.1-mini",
		"o4-mini-2025-04-16":         "o4-mini",
		"claude-sonnet-4-5-20250929": "claude-sonnet-4-5", "claude-sonnet-4-5@20250929": "claude-sonnet-4-5",
		"claude-sonnet-4-5-latest": "claude-sonnet-4-5", "claude-haiku-4-5-20251001": "claude-haiku-4-5",
		"claude-opus-4-1-20250805": "claude-opus-4-1", "claude-opus-4-1@20250805": "claude-opus-4-1",
		"claude-opus-5": "claude-opus-5", "claude-fable-5": "claude-fable-5",
		"gemini-2.5-pro": "gemini-2.5-pro", "gemini-2.5-flash": "gemini-2.5-flash",
		"gemini-2.5-flash-lite": "gemini-2.5-flash-lite", "gemini-2.5-flash-lite-preview-06-17": "gemini-2.5-flash-lite",
		"gemini-2.5-flash-preview-09-2025": "gemini-2.5-flash",
		"text-embedding-3-small":           "text-embedding-3-small", "text-embedding-3-large": "text-embedding-3-large",
	} {
		p, ok := book.At(name, now)
		if !ok || p.Model != want {
			t.Errorf("At(%q) = %q, %v; want %q", name, p.Model, ok, want)
		}
	}
	// Names of no priced model, among them families the model table
	// knows without a price: they never borrow a shorter name's price.
	for _, name := range []string{
		"", "GPT-4o", "gpt-4o ", "gpt-4", "gpt-40", "gpt-4.1-nano", "gpt-4.1-nano-2025-04-14", "o3", "o3-2025-04-16",
		"gpt-4-1106-preview", "claude-opus-5-5", "claude-fable-5-2", "claude-fable-5-2-20261101",
		"claude-sonnet-4-20250514", "claude-opus-4-20250514", "claude-3-5-sonnet-latest", "-latest", "@20250929",
		"gemini-2.0-flash", "text-embedding-ada-002",
	} {
		if p, ok := book.At(name, now); ok {
			t.Errorf("At(%q) = %q, want no price", name, p.Model)
		}
	}
	// The default file's every model answers for itself, with its prices.
	for _, want := range bookRows(t, t0, t0) {
		p, ok := book.AtTier(want.Model, want.ServiceTier, now)
		if !ok || !p.SamePrices(&want) {
			t.Errorf("At(%q) = %+v, %v; want %+v", want.Model, p, ok, want)
		}
	}
	var nilBook *estimator.PriceBook
	if _, ok := nilBook.At("gpt-4o", now); ok || !nilBook.Version().IsZero() {
		t.Error("a nil book has prices")
	}
	if _, ok := nilBook.Exact("gpt-4o", t0); ok {
		t.Error("a nil book has rows")
	}
}

// TestPriceBookHistory: each row answers from its effective_from
// (inclusive) to the next row's (exclusive), a price that takes effect
// later is not used before, Exact finds a row by its key and time only,
// and Version is the latest created_at.
func TestPriceBookHistory(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	t1 := t0.Add(24 * time.Hour)
	t2 := t1.Add(24 * time.Hour)
	rows := []estimator.Price{
		// Out of order on purpose: the book sorts its copy.
		{Model: "gpt-4o", EffectiveFrom: t2, InputMicro: 3, CreatedAt: t0.Add(2 * time.Minute)},
		{Model: "gpt-4o", EffectiveFrom: t0, InputMicro: 1, CreatedAt: t0.Add(-time.Hour)},
		{Model: "gpt-4o-mini", EffectiveFrom: t1, InputMicro: 10, CreatedAt: t0.Add(time.Minute)},
		{Model: "gpt-4o", EffectiveFrom: t1, InputMicro: 2, CreatedAt: t0.Add(-time.Minute)},
	}
	book := estimator.NewPriceBook(rows)
	if rows[0].InputMicro != 3 || rows[1].InputMicro != 1 {
		t.Fatal("NewPriceBook reordered its argument")
	}
	for _, tc := range []struct {
		name  string
		at    time.Time
		input int64 // 0: no price
	}{
		{"gpt-4o", t0.Add(-time.Nanosecond), 0},
		{"gpt-4o", t0, 1},
		{"gpt-4o-2024-08-06", t1.Add(-time.Nanosecond), 1},
		{"gpt-4o", t1, 2},
		{"gpt-4o-2024-08-06", t1.Add(time.Hour), 2},
		{"gpt-4o", t2, 3},
		{"gpt-4o", t2.Add(365 * 24 * time.Hour), 3},
		// gpt-4o-mini's price starts at t1: before, it has none, and it
		// does not fall back to gpt-4o's.
		{"gpt-4o-mini", t0, 0},
		{"gpt-4o-mini-2024-07-18", t1.Add(-time.Nanosecond), 0},
		{"gpt-4o-mini", t1, 10},
		// The same instant in another zone is the same instant.
		{"gpt-4o", t1.In(time.FixedZone("x", -5*3600)), 2},
	} {
		p, ok := book.At(tc.name, tc.at)
		if (tc.input == 0) == ok || p.InputMicro != tc.input {
			t.Errorf("At(%q, %v) = %+v, %v; want input %d", tc.name, tc.at, p, ok, tc.input)
		}
	}
	for _, tc := range []struct {
		model string
		from  time.Time
		input int64
	}{
		{"gpt-4o", t0, 1}, {"gpt-4o", t1, 2}, {"gpt-4o", t2.In(time.FixedZone("y", 3600)), 3}, {"gpt-4o-mini", t1, 10},
		{"gpt-4o", t0.Add(time.Microsecond), 0}, {"gpt-4o-mini", t0, 0},
		{"gpt-4o-2024-08-06", t0, 0}, // a key, not a request's name
		{"nobody", t0, 0},
	} {
		p, ok := book.Exact(tc.model, tc.from)
		if (tc.input == 0) == ok || p.InputMicro != tc.input {
			t.Errorf("Exact(%q, %v) = %+v, %v; want input %d", tc.model, tc.from, p, ok, tc.input)
		}
	}
	if v := book.Version(); !v.Equal(t0.Add(2 * time.Minute)) {
		t.Errorf("Version = %v, want the latest created_at", v)
	}
	if v := estimator.NewPriceBook(nil).Version(); !v.IsZero() {
		t.Errorf("empty book's Version = %v", v)
	}
}

// TestPriceBookAtAllocates: pricing an admission allocates nothing,
// whichever rule finds the name. Not parallel: AllocsPerRun counts the
// whole process's allocations.
func TestPriceBookAtAllocates(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	book := estimator.NewPriceBook(bookRows(t, t0, t0))
	now := t0.Add(time.Hour)
	for _, name := range []string{"gpt-4o", "gpt-4o-2024-08-06", "claude-sonnet-4-5-20250929", "gemini-2.5-flash-preview-09-2025", "no-such-model"} {
		if n := testing.AllocsPerRun(100, func() { book.At(name, now) }); n != 0 {
			t.Errorf("At(%q) allocates %v times", name, n)
		}
	}
	p, _ := book.At("gpt-4o", now)
	u := estimator.MoneyUsage{Input: 1000, CachedRead: 10, Output: 100, Reasoning: 5}
	if n := testing.AllocsPerRun(100, func() { _, _ = p.Cost(u) }); n != 0 {
		t.Errorf("Cost allocates %v times", n)
	}
}

// TestPriceBookLoad: a book loaded from the table holds the default
// file's prices as PriceImport stored them, a later row is used only from
// its effective_from, Exact finds each row an admission could record,
// and Version is the table's max(created_at), read the way a decision
// will read it.
func TestPriceBookLoad(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.New(t, nil)
	empty, err := estimator.PriceBookLoad(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := empty.At("gpt-4o", time.Now()); ok || !empty.Version().IsZero() {
		t.Fatalf("empty table: a price, or version %v", empty.Version())
	}

	f, err := estimator.DefaultPriceFile()
	if err != nil {
		t.Fatal(err)
	}
	res, err := estimator.PriceImport(ctx, pool, f, "alice")
	if err != nil {
		t.Fatal(err)
	}
	imported := res.Inserted[0].EffectiveFrom
	later := time.Now().Add(time.Hour).Truncate(time.Microsecond)
	next, err := estimator.PriceInsert(ctx, pool, estimator.Price{Model: "gpt-4o", EffectiveFrom: later, Currency: "USD",
		InputMicro: 2_000_000, OutputMicro: 8_000_000, CreatedBy: "bob"})
	if err != nil {
		t.Fatal(err)
	}

	book, err := estimator.PriceBookLoad(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	var version time.Time
	if err := pool.QueryRow(ctx, `SELECT max(created_at) FROM model_prices`).Scan(&version); err != nil {
		t.Fatal(err)
	}
	if !book.Version().Equal(version) || !version.Equal(next.CreatedAt) {
		t.Fatalf("Version = %v, max(created_at) = %v, last row created %v", book.Version(), version, next.CreatedAt)
	}
	ps, _ := f.Prices()
	for _, want := range ps {
		got, ok := book.AtTier(want.Model, want.ServiceTier, imported)
		if !ok || !got.SamePrices(&want) || got.CreatedBy != "alice" || got.Currency != "USD" {
			t.Errorf("%s at the import: %+v, %v; want %+v", want.Model, got, ok, want)
		}
		// The one row PriceAt reads from the table is the book's.
		db, err := estimator.PriceAtTier(ctx, pool, want.Model, want.ServiceTier, imported)
		if err != nil || !db.SamePrices(&got) || !db.EffectiveFrom.Equal(got.EffectiveFrom) {
			t.Errorf("%s: PriceAt %+v %v, book %+v", want.Model, db, err, got)
		}
		if ex, ok := book.ExactTier(got.Model, got.ServiceTier, got.EffectiveFrom); !ok || !ex.SamePrices(&got) {
			t.Errorf("%s: Exact(%v) = %+v, %v", want.Model, got.EffectiveFrom, ex, ok)
		}
	}
	if p, _ := book.At("gpt-4o-2024-08-06", later.Add(-time.Microsecond)); p.InputMicro != 2_500_000 {
		t.Errorf("gpt-4o before its new price: %+v", p)
	}
	if p, _ := book.At("gpt-4o-2024-08-06", later); p.InputMicro != 2_000_000 || p.CreatedBy != "bob" {
		t.Errorf("gpt-4o at its new price: %+v", p)
	}
	// A settle prices at the reserve's row whatever took effect since.
	if p, ok := book.Exact("gpt-4o", imported); !ok || p.InputMicro != 2_500_000 {
		t.Errorf("Exact of the imported row: %+v, %v", p, ok)
	}
	// What the default prices charge: gemini-2.5-pro past its 200k tier.
	gem, _ := book.At("gemini-2.5-pro", imported)
	if c, err := gem.Cost(estimator.MoneyUsage{Input: 250_000, Output: 2000}); err != nil || c != 250_000*5/2+2000*15 {
		t.Errorf("gemini-2.5-pro long call: %d, %v", c, err)
	}
}

// BenchmarkPriceBookAt: the price lookup of every admission, by the rule
// that finds the name.
func BenchmarkPriceBookAt(b *testing.B) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	rows := bookRows(b, t0, t0)
	// A little history, as a deployment accumulates it.
	for i := 1; i <= 8; i++ {
		rows = append(rows, bookRows(b, t0.Add(time.Duration(i)*24*time.Hour), t0)...)
	}
	book := estimator.NewPriceBook(rows)
	now := t0.Add(100 * 24 * time.Hour)
	for _, bc := range []struct{ name, model string }{
		{"exact", "gpt-4o"},
		{"dated", "gpt-4o-2024-08-06"},
		{"claude-dated", "claude-sonnet-4-5-20250929"},
		{"prefix", "gemini-2.5-flash-preview-09-2025"},
		{"unknown", "no-such-model-2025"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				book.At(bc.model, now)
			}
		})
	}
	b.Run("cost", func(b *testing.B) {
		p, _ := book.At("claude-sonnet-4-5", now)
		u := estimator.MoneyUsage{Input: 12_000, CachedRead: 8000, CacheWrite5m: 2000, Output: 900, Reasoning: 300}
		b.ReportAllocs()
		for b.Loop() {
			_, _ = p.Cost(u)
		}
	})
}

// TestPriceBookVersionUnderConcurrentInserts: while writers add prices
// from many connections, every book loaded holds every row created up to
// its Version (inserts hold the price lock and take created_at after it,
// so none commits later with an earlier created_at). A book whose Version
// equals the table's max(created_at) is therefore complete, which is the
// reload rule's premise.
func TestPriceBookVersionUnderConcurrentInserts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.New(t, func(c *pgxpool.Config) { c.MaxConns = 10 })
	const writers, each = 4, 5
	var wg sync.WaitGroup
	done := make(chan struct{})
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				if _, err := estimator.PriceInsert(ctx, pool, estimator.Price{Model: fmt.Sprintf("m-%d-%d", w, i), Currency: "USD",
					InputMicro: int64(i), OutputMicro: 1, CreatedBy: "w"}); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	go func() { wg.Wait(); close(done) }()
	loads := 0
	check := func() {
		t.Helper()
		book, err := estimator.PriceBookLoad(ctx, pool)
		if err != nil {
			t.Fatal(err)
		}
		loads++
		rows, err := pool.Query(ctx, `SELECT model, effective_from FROM model_prices WHERE created_at <= $1`, book.Version())
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var model string
			var from time.Time
			if err := rows.Scan(&model, &from); err != nil {
				t.Fatal(err)
			}
			if _, ok := book.Exact(model, from); !ok {
				t.Fatalf("load %d: %s at %v was created before the book's version %v but is not in it", loads, model, from, book.Version())
			}
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
	}
	for running := true; running; {
		select {
		case <-done:
			running = false
		default:
		}
		check()
	}
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	check()
	book, _ := estimator.PriceBookLoad(ctx, pool)
	var version time.Time
	var n int
	if err := pool.QueryRow(ctx, `SELECT max(created_at), count(*) FROM model_prices`).Scan(&version, &n); err != nil {
		t.Fatal(err)
	}
	if n != writers*each || !book.Version().Equal(version) {
		t.Fatalf("%d rows, version %v; book version %v", n, version, book.Version())
	}
	for w := range writers {
		for i := range each {
			if p, ok := book.At(fmt.Sprintf("m-%d-%d", w, i), version); !ok || p.InputMicro != int64(i) {
				t.Fatalf("m-%d-%d: %+v %v", w, i, p, ok)
			}
		}
	}
	t.Logf("%d loads while %d rows were added", loads, n)
}

// TestPriceBookConcurrentAt: one book priced from many goroutines at once
// (run with -race) answers each as it does alone.
func TestPriceBookConcurrentAt(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	book := estimator.NewPriceBook(bookRows(t, t0, t0))
	names := map[string]int64{"gpt-4o-2024-08-06": 2_500_000, "claude-sonnet-4-5@20250929": 3_000_000, "gemini-2.5-flash-lite": 100_000}
	var wg sync.WaitGroup
	bad := make(chan string, 16)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 500 {
				for name, input := range names {
					if p, ok := book.At(name, t0); !ok || p.InputMicro != input {
						bad <- name
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(bad)
	for name := range bad {
		t.Errorf("%s priced wrong under concurrency", name)
	}
}
