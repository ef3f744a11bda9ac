package estimator_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tokengate/tokengate/estimator"
	"github.com/tokengate/tokengate/integration/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func ptr(v int64) *int64 { return &v }

func priceCount(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM model_prices`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestParsePrice(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"1.25", 1_250_000, true},
		{"0.075", 75_000, true},
		{"10", 10_000_000, true},
		{"0", 0, true},
		{"0.000001", 1, true},
		{"1000000", 1_000_000_000_000, true},
		{"0.0000001", 0, false}, // 7 places
		{"-1", 0, false},
		{"+1", 0, false},
		{"", 0, false},
		{".5", 0, false},
		{"1e3", 0, false},
		{"1000001", 0, false},
		{"99999999999999999999", 0, false},
	} {
		got, err := estimator.ParsePrice(tc.in, "input")
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParsePrice(%q) = %d, %v; want %d ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
		var inv *estimator.InvalidError
		if err != nil && (!errors.As(err, &inv) || inv.Field != "input") {
			t.Errorf("ParsePrice(%q): error %v does not name the field", tc.in, err)
		}
		if tc.ok {
			if back, _ := estimator.ParsePrice(estimator.FormatPrice(got), "x"); back != got {
				t.Errorf("FormatPrice(%d) = %q does not round-trip", got, estimator.FormatPrice(got))
			}
		}
	}
	if s := estimator.FormatPrice(1_250_000); s != "1.25" {
		t.Errorf("FormatPrice = %q", s)
	}
}

func TestDefaultPriceFile(t *testing.T) {
	t.Parallel()
	f, err := estimator.DefaultPriceFile()
	if err != nil {
		t.Fatal(err)
	}
	if f.Version == "" || f.Currency != "USD" || len(f.Providers) != 3 {
		t.Fatalf("default file: %+v", f)
	}
	for _, pr := range f.Providers {
		if !strings.HasPrefix(pr.Source, "https://") || len(pr.Taken) != len("2006-01-02") || len(pr.Models) == 0 {
			t.Errorf("provider %s lacks its source, date or models: %+v", pr.Provider, pr)
		}
		if _, err := time.Parse("2006-01-02", pr.Taken); err != nil {
			t.Errorf("provider %s: taken %q: %v", pr.Provider, pr.Taken, err)
		}
	}
	ps, err := f.Prices()
	if err != nil {
		t.Fatal(err)
	}
	byModel := map[string]estimator.Price{}
	tiers := map[string]estimator.Price{}
	for _, p := range ps {
		if p.ServiceTier == estimator.TierDefault {
			byModel[p.Model] = p
		}
		tiers[p.Model+"/"+p.ServiceTier] = p
	}
	// Every seeded batch row, and o4-mini's flex row, is half of its
	// default row, part by part; every priced OpenAI and Anthropic model
	// has a batch row.
	half := func(d, h *int64) bool { return (d == nil) == (h == nil) && (d == nil || *d == 2**h) }
	for _, p := range ps {
		if p.ServiceTier != estimator.TierBatch && !(p.ServiceTier == estimator.TierFlex && p.Model == "o4-mini") {
			continue
		}
		d, ok := byModel[p.Model]
		if !ok || d.InputMicro != 2*p.InputMicro || d.OutputMicro != 2*p.OutputMicro || !half(d.CachedInputMicro, p.CachedInputMicro) ||
			!half(d.CacheWrite5mMicro, p.CacheWrite5mMicro) || !half(d.CacheWrite1hMicro, p.CacheWrite1hMicro) {
			t.Errorf("%s %s row is not half of its default row: %+v, default %+v", p.Model, p.ServiceTier, p, d)
		}
	}
	for _, pr := range f.Providers {
		for _, m := range pr.Models {
			if _, ok := tiers[m.Model+"/batch"]; !ok && pr.Provider != "google" {
				t.Errorf("%s has no batch row", m.Model)
			}
		}
	}
	if p := tiers["gpt-4.1/priority"]; p.InputMicro != 3_500_000 || p.OutputMicro != 14_000_000 {
		t.Errorf("gpt-4.1 priority: %+v", p)
	}
	if p := byModel["claude-sonnet-4-5"]; p.InputMicro != 3_000_000 || p.OutputMicro != 15_000_000 || *p.CacheWrite5mMicro != 3_750_000 ||
		*p.CacheWrite1hMicro != 6_000_000 || *p.CachedInputMicro != 300_000 || p.ReasoningOutputMicro != nil {
		t.Errorf("claude-sonnet-4-5: %+v", p)
	}
	if p := byModel["gemini-2.5-pro"]; p.LongContextThreshold == nil || *p.LongContextThreshold != 200_000 || *p.LongInputMicro != 2_500_000 {
		t.Errorf("gemini-2.5-pro long context: %+v", p)
	}
	if p := byModel["gpt-4o"]; p.InputMicro != 2_500_000 || *p.CachedInputMicro != 1_250_000 || p.CacheWrite5mMicro != nil ||
		!strings.Contains(p.Source, f.Version) {
		t.Errorf("gpt-4o: %+v", p)
	}

	for _, bad := range []string{
		`{"version":"1","providers":[],"extra":1}`,
		`{"providers":[]}`,
		`{"version":"1","providers":[{"provider":"x","models":[{"model":"m","input":"1","output":"x"}]}]}`,
		`{"version":"1","providers":[{"provider":"x","models":[{"model":"m","input":"1","output":"1"},{"model":"m","input":"1","output":"1"}]}]}`,
		`{"version":"1","providers":[{"provider":"x","models":[{"model":"m","input":"1","output":"1","long_context":{"threshold":0,"input":"1","output":"1"}}]}]}`,
	} {
		if _, err := estimator.ParsePriceFile([]byte(bad)); err == nil {
			t.Errorf("accepted %s", bad)
		}
	}
}

// TestPriceImportIdempotent: importing the same file twice adds nothing the
// second time; a file with one changed price adds exactly that model's row,
// effective after the first, and the earlier row still answers for the
// earlier time.
func TestPriceImportIdempotent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.New(t, nil)
	f, err := estimator.DefaultPriceFile()
	if err != nil {
		t.Fatal(err)
	}
	ps, _ := f.Prices()
	res, err := estimator.PriceImport(ctx, pool, f, "alice")
	if err != nil || len(res.Inserted) != len(ps) || res.Unchanged != 0 {
		t.Fatalf("first import: %d inserted, %d unchanged, %v", len(res.Inserted), res.Unchanged, err)
	}
	if res.Inserted[0].CreatedBy != "alice" || !strings.Contains(res.Inserted[0].Source, f.Version) {
		t.Fatalf("inserted row lacks its actor or source: %+v", res.Inserted[0])
	}
	first := res.Inserted[0].EffectiveFrom
	res, err = estimator.PriceImport(ctx, pool, f, "alice")
	if err != nil || len(res.Inserted) != 0 || res.Unchanged != len(ps) {
		t.Fatalf("second import: %d inserted, %d unchanged, %v", len(res.Inserted), res.Unchanged, err)
	}
	if n := priceCount(t, pool); n != len(ps) {
		t.Fatalf("%d rows after two imports of %d prices", n, len(ps))
	}

	changed, _ := estimator.ParsePriceFile([]byte(`{"version":"2","providers":[{"provider":"openai","source":"https://x","taken":"2026-12-05",
		"models":[{"model":"gpt-4o","input":"2.00","cached_input":"1.25","output":"10.00"},{"model":"gpt-4o-mini","input":"0.15","cached_input":"0.075","output":"0.60"}]}]}`))
	res, err = estimator.PriceImport(ctx, pool, changed, "bob")
	if err != nil || len(res.Inserted) != 1 || res.Inserted[0].Model != "gpt-4o" || res.Unchanged != 1 {
		t.Fatalf("changed import: %+v %v", res, err)
	}
	if n := priceCount(t, pool); n != len(ps)+1 {
		t.Fatalf("%d rows, want %d", n, len(ps)+1)
	}
	old, err := estimator.PriceAt(ctx, pool, "gpt-4o", first)
	if err != nil || old.InputMicro != 2_500_000 {
		t.Fatalf("price at the first import: %+v %v", old, err)
	}
	cur, err := estimator.PriceAt(ctx, pool, "gpt-4o", time.Now().Add(time.Minute))
	if err != nil || cur.InputMicro != 2_000_000 || cur.CreatedBy != "bob" {
		t.Fatalf("price now: %+v %v", cur, err)
	}
	all, err := estimator.PriceHistory(ctx, pool, "gpt-4o")
	var hist []estimator.Price // the default tier's (the file prices gpt-4o's batch and priority tiers too)
	for _, p := range all {
		if p.ServiceTier == estimator.TierDefault {
			hist = append(hist, p)
		}
	}
	if err != nil || len(hist) != 2 || !hist[0].EffectiveFrom.Before(hist[1].EffectiveFrom) {
		t.Fatalf("history: %+v %v", hist, err)
	}
}

// TestPriceAtBoundaries: each row answers from its effective_from
// (inclusive) to the next row's (exclusive); before the first there is no
// price.
func TestPriceAtBoundaries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.New(t, nil)
	t0 := time.Now().Add(time.Hour).Truncate(time.Microsecond)
	t1 := t0.Add(24 * time.Hour)
	for _, p := range []estimator.Price{
		{Model: "m", EffectiveFrom: t0, Currency: "USD", InputMicro: 1_000_000, OutputMicro: 2_000_000, CreatedBy: "a"},
		{Model: "m", EffectiveFrom: t1, Currency: "USD", InputMicro: 3_000_000, OutputMicro: 4_000_000, ReasoningOutputMicro: ptr(5_000_000), CreatedBy: "a"},
		{Model: "other", EffectiveFrom: t0.Add(time.Minute), Currency: "USD", InputMicro: 7, OutputMicro: 8, CreatedBy: "a"},
	} {
		if _, err := estimator.PriceInsert(ctx, pool, p); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		at    time.Time
		input int64 // 0: no price
	}{
		{t0.Add(-time.Microsecond), 0},
		{t0, 1_000_000},
		{t1.Add(-time.Microsecond), 1_000_000},
		{t1, 3_000_000},
		{t1.Add(365 * 24 * time.Hour), 3_000_000},
	} {
		p, err := estimator.PriceAt(ctx, pool, "m", tc.at)
		switch {
		case tc.input == 0 && !errors.Is(err, estimator.ErrNoPrice):
			t.Errorf("at %v: %+v %v, want ErrNoPrice", tc.at, p, err)
		case tc.input != 0 && (err != nil || p.InputMicro != tc.input):
			t.Errorf("at %v: %+v %v, want input %d", tc.at, p, err, tc.input)
		}
	}
	list, err := estimator.PriceList(ctx, pool, "", "", t1)
	if err != nil || len(list) != 2 || list[0].Model != "m" || list[0].InputMicro != 3_000_000 || list[1].Model != "other" {
		t.Fatalf("list at t1: %+v %v", list, err)
	}
	if list, _ := estimator.PriceList(ctx, pool, "other", "", t1); len(list) != 1 || list[0].Model != "other" {
		t.Fatalf("list of one model: %+v", list)
	}
	if list, _ := estimator.PriceList(ctx, pool, "", "", t0.Add(time.Second)); len(list) != 1 || list[0].Model != "m" {
		t.Fatalf("list before other's price: %+v", list)
	}

	// The past cannot be rewritten, a time cannot be priced twice, and
	// the deployment has one currency.
	var inv *estimator.InvalidError
	_, err = estimator.PriceInsert(ctx, pool, estimator.Price{Model: "m", EffectiveFrom: time.Now().Add(-time.Hour), Currency: "USD", CreatedBy: "a"})
	if !errors.As(err, &inv) || inv.Field != "effective_from" {
		t.Fatalf("past price: %v", err)
	}
	_, err = estimator.PriceInsert(ctx, pool, estimator.Price{Model: "m", EffectiveFrom: t1, Currency: "USD", CreatedBy: "a"})
	if !errors.As(err, &inv) || inv.Field != "effective_from" {
		t.Fatalf("same time twice: %v", err)
	}
	_, err = estimator.PriceInsert(ctx, pool, estimator.Price{Model: "n", Currency: "EUR", CreatedBy: "a"})
	if !errors.As(err, &inv) || inv.Field != "currency" {
		t.Fatalf("second currency: %v", err)
	}
	_, err = estimator.PriceInsert(ctx, pool, estimator.Price{Model: "n", Currency: "USD", LongContextThreshold: ptr(10), CreatedBy: "a"})
	if !errors.As(err, &inv) || inv.Field != "long_context" {
		t.Fatalf("half a long-context tier: %v", err)
	}
	if n := priceCount(t, pool); n != 3 {
		t.Fatalf("%d rows after refused inserts", n)
	}
}

// TestPricesAppendOnly: the database itself refuses to change or remove a
// price, whoever asks.
func TestPricesAppendOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.New(t, nil)
	if _, err := estimator.PriceInsert(ctx, pool, estimator.Price{Model: "m", Currency: "USD", InputMicro: 1, OutputMicro: 2, CreatedBy: "a"}); err != nil {
		t.Fatal(err)
	}
	for _, sql := range []string{
		`UPDATE model_prices SET input_micro = 0`,
		`UPDATE model_prices SET effective_from = effective_from - interval '1 day'`,
		`DELETE FROM model_prices`,
		`TRUNCATE model_prices`,
	} {
		_, err := pool.Exec(ctx, sql)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42501" || !strings.Contains(pgErr.Message, "append-only") {
			t.Errorf("%s: %v", sql, err)
		}
	}
	p, err := estimator.PriceAt(ctx, pool, "m", time.Now().Add(time.Minute))
	if err != nil || p.InputMicro != 1 || priceCount(t, pool) != 1 {
		t.Fatalf("after the refused changes: %+v %v", p, err)
	}
}

// TestPriceImportConcurrent: imports from many goroutines over many
// connections add each price exactly once.
func TestPriceImportConcurrent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.New(t, func(c *pgxpool.Config) { c.MaxConns = 8 })
	f, err := estimator.DefaultPriceFile()
	if err != nil {
		t.Fatal(err)
	}
	ps, _ := f.Prices()
	const importers = 12
	var wg sync.WaitGroup
	inserted := make([]int, importers)
	errs := make([]error, importers)
	start := make(chan struct{})
	for i := range importers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			res, err := estimator.PriceImport(ctx, pool, f, "replica")
			inserted[i], errs[i] = len(res.Inserted), err
		}()
	}
	close(start)
	wg.Wait()
	total := 0
	for i := range importers {
		if errs[i] != nil {
			t.Fatalf("importer %d: %v", i, errs[i])
		}
		total += inserted[i]
	}
	if total != len(ps) {
		t.Fatalf("importers reported %d rows inserted, want %d", total, len(ps))
	}
	if n := priceCount(t, pool); n != len(ps) {
		t.Fatalf("%d rows, want exactly %d", n, len(ps))
	}
	var models int
	if err := pool.QueryRow(ctx, `SELECT count(DISTINCT (model, service_tier)) FROM model_prices`).Scan(&models); err != nil || models != len(ps) {
		t.Fatalf("%d distinct models and tiers, %v", models, err)
	}
}
