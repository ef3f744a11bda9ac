package batch_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/batch"
	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
	"github.com/tokengate/tokengate/ledger"
)

// prices prices gpt-4o at 2.50 in, 1.25 cached, 10.00 out (no batch row:
// its batch price is half of that) and gpt-4o-mini with a batch row of its
// own (0.05 in, 0.20 out).
func (b *testBundle) prices(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	from := time.Unix(0, b.now.Load()).Add(-time.Hour)
	for _, p := range []struct {
		model, tier string
		in, out     int64
		cached      *int64
	}{{"gpt-4o", "default", 2_500_000, 10_000_000, ptr(1_250_000)}, {"gpt-4o-mini", "default", 150_000, 600_000, nil},
		{"gpt-4o-mini", "batch", 50_000, 200_000, nil}} {
		if _, err := b.pool.Exec(ctx, `INSERT INTO model_prices (model, service_tier, effective_from, input_micro, output_micro,
			cached_input_micro, created_by) VALUES ($1, $2, $3, $4, $5, $6, 'test')`, p.model, p.tier, from, p.in, p.out, p.cached); err != nil {
			t.Fatal(err)
		}
	}
}

// moneyTree makes org (with a monthly money window of limit micro-units)
// and its team "team" (with a batch allowance and a key). It returns
// team's key.
func (b *testBundle) moneyTree(t *testing.T, limit int64) string {
	t.Helper()
	ctx := context.Background()
	month, err := rule.ParseWindow("month", "UTC", "", "")
	if err != nil {
		t.Fatal(err)
	}
	org := rule.Limits{TokensCapacity: 1000, TokensRateMicro: rule.Micro,
		Windows: []rule.WindowLimit{{Name: "spend", Window: month, Counts: rule.CountMoney, Limit: limit}}}
	if _, err := b.store.CreateTenant(ctx, account.CreateTenantParams{ID: "org", Limits: org}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.CreateTenant(ctx, account.CreateTenantParams{ID: "team", Parent: "org",
		Limits: rule.Limits{TokensCapacity: 1000, TokensRateMicro: rule.Micro}}); err != nil {
		t.Fatal(err)
	}
	k, _, err := credential.KeyCreate(ctx, b.pool, "team")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.svc.SetAllowance(ctx, batch.SetAllowanceParams{TenantID: "team", Capacity: 100_000_000}); err != nil {
		t.Fatal(err)
	}
	return k.ID
}

func ptr(v int64) *int64 { return &v }

// spent is what org's money window has counted.
func (b *testBundle) spent(t *testing.T) int64 {
	t.Helper()
	s, err := b.store.TenantSnapshot(context.Background(), "org")
	if err != nil {
		t.Fatal(err)
	}
	return s.Windows[0].Used
}

// ledgerMoney is the sum of the money of tenant's entries.
func (b *testBundle) ledgerMoney(t *testing.T, tenant string) int64 {
	t.Helper()
	var m int64
	if err := b.pool.QueryRow(context.Background(), `SELECT coalesce(sum(money_micro), 0) FROM ledger_entries WHERE tenant_id = $1`, tenant).Scan(&m); err != nil {
		t.Fatal(err)
	}
	return m
}

// cost is micro-units of in and out tokens at prices per million, rounded up.
func cost(in, out, pin, pout int64) int64 { return (in*pin + out*pout + 999_999) / 1_000_000 }

// A batch's money is its lines' at the batch price: the 'batch' row where
// the model has one, else the default row at half (not at full price). It
// is reserved in the money windows of the tenant's tree with the batch;
// each line's settle charges what it used, cached input at the cached
// price, and a refund gives back its line's money: the window and the
// ledger's money end at exactly what the lines cost.
func TestBatchMoneyAtBatchPrices(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.prices(t)
	key := b.moneyTree(t, 1_000_000_000)
	lines := []batch.Line{{CustomID: "a", Request: chat(t, "gpt-4o", "Hello there, a line of a batch", 1000)},
		{CustomID: "b", Request: chat(t, "gpt-4o-mini", "Hello there, another line", 500)},
		{CustomID: "c", Request: chat(t, "gpt-4o", "A line that fails", 200)}}
	plan, err := b.svc.Plan(ctx, "team", "", lines)
	if err != nil {
		t.Fatal(err)
	}
	a, m, c := plan.Lines[0], plan.Lines[1], plan.Lines[2]
	want := []int64{cost(a.InputTokens, a.OutputTokens, 1_250_000, 5_000_000), cost(m.InputTokens, m.OutputTokens, 50_000, 200_000),
		cost(c.InputTokens, c.OutputTokens, 1_250_000, 5_000_000)}
	for i, l := range plan.Lines {
		if l.MoneyMicro == nil || *l.MoneyMicro != want[i] {
			t.Fatalf("line %s: money %v, want %d", l.CustomID, l.MoneyMicro, want[i])
		}
	}
	reserved := want[0] + want[1] + want[2]
	if plan.MoneyMicro != reserved || plan.Unpriced != "" {
		t.Fatalf("plan money %d (%q), want %d", plan.MoneyMicro, plan.Unpriced, reserved)
	}
	bt, err := b.svc.Reserve(ctx, batch.ReserveParams{TenantID: "team", KeyID: key, Provider: batch.Anthropic, Plan: plan})
	if err != nil {
		t.Fatal(err)
	}
	if bt.MoneyMicro != reserved || b.spent(t) != reserved {
		t.Fatalf("reserved %d, the window counts %d; want %d", bt.MoneyMicro, b.spent(t), reserved)
	}
	// a: 400 input of which 300 cached, 100 output; b at its estimate;
	// c failed.
	sum, err := b.svc.End(ctx, batch.EndParams{TenantID: "team", BatchID: bt.ID, Status: "ended", Results: []batch.Result{
		{CustomID: "a", Succeeded: true, Input: 400, CacheRead: 300, Output: 100},
		{CustomID: "b", Succeeded: true, AtEstimate: true}, {CustomID: "c"}}})
	if err != nil {
		t.Fatal(err)
	}
	actualA := int64(100*1_250_000+300*625_000+100*5_000_000+999_999) / 1_000_000
	actual := actualA + want[1]
	if sum.ActualMoney != actual || sum.SettledMoney != want[0]+want[1] || sum.RefundedMoney != want[2] {
		t.Fatalf("summary %+v, want actual %d", sum, actual)
	}
	if b.spent(t) != actual || b.ledgerMoney(t, "team") != actual || b.ledgerMoney(t, "org") != actual {
		t.Fatalf("window %d, team's ledger %d, org's %d; want %d", b.spent(t), b.ledgerMoney(t, "team"), b.ledgerMoney(t, "org"), actual)
	}
	ls, err := b.svc.Lines(ctx, bt.ID)
	if err != nil {
		t.Fatal(err)
	}
	// The allowance: a's 300 cached tokens at gpt-4o's cached weight, as
	// a single call's (the table's weight, 1 unless a deployment set one).
	m4o, _ := estimator.DefaultTable().Lookup("gpt-4o")
	weighted := m4o.EffectiveCacheInput(400, estimator.CacheUsage{Read: 300})
	if ls[0].ActualInput != 400 || ls[0].ActualMicro != batch.PriceMicro(weighted, 100, a.InputWeightMicro, a.OutputWeightMicro) {
		t.Fatalf("line a: %+v", ls[0])
	}
	for _, id := range []string{"team", "org"} {
		if _, err := ledger.Verify(ctx, b.pool, id); err != nil {
			t.Fatal(err)
		}
	}
}

// A batch whose money does not fit an enforced money window (of the
// tenant or an ancestor) is refused naming the window, and takes nothing:
// no allowance, no money, no batch.
func TestBatchRefusedByAMoneyWindow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.prices(t)
	key := b.moneyTree(t, 1)
	plan, err := b.svc.Plan(ctx, "team", "", []batch.Line{{CustomID: "a", Request: chat(t, "gpt-4o", "Hello there", 1000)}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.svc.Reserve(ctx, batch.ReserveParams{TenantID: "team", KeyID: key, Provider: batch.Anthropic, Plan: plan})
	var exh *rule.BudgetExhaustedError
	var big *rule.TooLargeError
	switch {
	case errors.As(err, &big):
		if big.Window != "spend" || big.Level != "org" {
			t.Fatalf("too large: %+v", big)
		}
	case errors.As(err, &exh):
		t.Fatalf("a batch larger than the window's ceiling is too large, not exhausted: %+v", exh)
	default:
		t.Fatalf("reserve over the window: %v", err)
	}
	a, err := b.svc.Allowance(ctx, "team")
	if err != nil {
		t.Fatal(err)
	}
	var batches int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM batches`).Scan(&batches); err != nil {
		t.Fatal(err)
	}
	if a.EnqueuedMicro != 0 || b.spent(t) != 0 || batches != 0 || b.ledgerMoney(t, "team") != 0 {
		t.Fatalf("a refused batch took: enqueued %d, money %d, %d batches", a.EnqueuedMicro, b.spent(t), batches)
	}
}

// Many batches race for a money window that fits exactly fit of them:
// exactly fit are reserved, each refusal names the window as exhausted,
// the window counts exactly their money, and after they end it counts
// exactly what their lines cost, as the ledger's money does.
func TestConcurrentBatchesWithinTheMoneyWindow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const fit, tries = 6, 30
	// One plan's money, to size the window: it is priced as below.
	lines := []batch.Line{{CustomID: "x", Request: chat(t, "gpt-4o", "Hello there, a line", 300)},
		{CustomID: "y", Request: chat(t, "gpt-4o-mini", "Hello there, a line", 300)}}
	b.prices(t)
	if _, err := b.svc.SetAllowance(ctx, batch.SetAllowanceParams{TenantID: "acme", Capacity: 1_000_000}); err != nil {
		t.Fatal(err)
	}
	probe, err := b.svc.Plan(ctx, "acme", "", lines)
	if err != nil {
		t.Fatal(err)
	}
	per := probe.MoneyMicro
	// The window fits fit batches and part of another.
	key := b.moneyTree(t, fit*per+per/2)
	plan, err := b.svc.Plan(ctx, "team", "", lines)
	if err != nil || plan.MoneyMicro != per {
		t.Fatalf("plan: %v, money %d, want %d", err, plan.MoneyMicro, per)
	}
	var admitted atomic.Int64
	ids := make(chan string, tries)
	errs := make(chan error, tries)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range tries {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			bt, err := b.svc.Reserve(ctx, batch.ReserveParams{TenantID: "team", KeyID: key, Provider: batch.Anthropic, Plan: plan})
			var exh *rule.BudgetExhaustedError
			switch {
			case err == nil:
				admitted.Add(1)
				ids <- bt.ID
			case errors.As(err, &exh) && exh.Window == "spend" && exh.Level == "org":
			default:
				errs <- fmt.Errorf("reserve: %w", err)
			}
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	close(ids)
	for err := range errs {
		t.Fatal(err)
	}
	if admitted.Load() != fit || b.spent(t) != fit*per {
		t.Fatalf("admitted %d (want %d), the window counts %d (want %d)", admitted.Load(), fit, b.spent(t), fit*per)
	}
	// Each ends concurrently: x used 10 in, 5 out; y failed.
	var ended sync.WaitGroup
	for id := range ids {
		ended.Add(1)
		go func() {
			defer ended.Done()
			if _, err := b.svc.End(ctx, batch.EndParams{TenantID: "team", BatchID: id, Status: "ended",
				Results: []batch.Result{{CustomID: "x", Succeeded: true, Input: 10, Output: 5}}}); err != nil {
				t.Error(err)
			}
		}()
	}
	ended.Wait()
	want := fit * cost(10, 5, 1_250_000, 5_000_000)
	if b.spent(t) != want || b.ledgerMoney(t, "team") != want || b.ledgerMoney(t, "org") != want {
		t.Fatalf("window %d, team's ledger %d, org's %d; want %d", b.spent(t), b.ledgerMoney(t, "team"), b.ledgerMoney(t, "org"), want)
	}
	for _, id := range []string{"team", "org"} {
		if _, err := ledger.Verify(ctx, b.pool, id); err != nil {
			t.Fatal(err)
		}
	}
}

// File records are purged by the sweeper after their retention: a file
// no batch was made of after UnusedFileRetention, a file a batch was made
// of only once it ended, EndedFileRetention later; the batch and its
// lines stay. The Service's Stats count the batch and its lines.
func TestPurgeFilesAfterTheirRetention(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	if _, err := b.svc.SetAllowance(ctx, batch.SetAllowanceParams{TenantID: "acme", Capacity: 1_000_000}); err != nil {
		t.Fatal(err)
	}
	b.upload(t, "unused", 1)
	b.upload(t, "used", 2)
	bt, err := b.svc.Reserve(ctx, batch.ReserveParams{TenantID: "acme", KeyID: b.key, Provider: batch.OpenAI, FileID: "used"})
	if err != nil {
		t.Fatal(err)
	}
	purge := func(want int) {
		t.Helper()
		if n, err := b.svc.PurgeFiles(ctx, 100); err != nil || n != want {
			t.Fatalf("purged %d (%v), want %d", n, err, want)
		}
	}
	b.advance(batch.UnusedFileRetention - time.Minute)
	purge(0)
	b.advance(2 * time.Minute)
	purge(1)
	if _, err := b.svc.FileOf(ctx, batch.OpenAI, "unused", "acme"); !errors.Is(err, batch.ErrFileNotFound) {
		t.Fatalf("the unused file: %v", err)
	}
	if _, err := b.svc.FileOf(ctx, batch.OpenAI, "used", "acme"); err != nil {
		t.Fatalf("the file of an open batch was purged: %v", err)
	}
	if _, err := b.svc.End(ctx, batch.EndParams{TenantID: "acme", BatchID: bt.ID, Status: "completed",
		Results: []batch.Result{{CustomID: "r0", Succeeded: true, Input: 3, Output: 2}}}); err != nil {
		t.Fatal(err)
	}
	b.advance(batch.EndedFileRetention - time.Minute)
	purge(0)
	b.advance(2 * time.Minute)
	purge(1)
	ls, err := b.svc.Lines(ctx, bt.ID)
	if err != nil || len(ls) != 2 {
		t.Fatalf("the batch's lines after its file was purged: %+v %v", ls, err)
	}
	st := b.svc.Stats()
	if st.Created[batch.OpenAI] != 1 || st.Ended["completed"] != 1 || st.LinesSettled != 1 || st.LinesRefunded != 1 || st.Refused != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// The drift report of batch lines: a row per tenant and model (or per
// model), each line an admission, with its money at the batch price, so
// that a tenant's reported spend includes its batches.
func TestBatchDrift(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.prices(t)
	key := b.moneyTree(t, 1_000_000_000)
	plan, err := b.svc.Plan(ctx, "team", "", []batch.Line{{CustomID: "a", Request: chat(t, "gpt-4o", "Hello there", 1000)},
		{CustomID: "c", Request: chat(t, "gpt-4o", "Hello again", 200)}})
	if err != nil {
		t.Fatal(err)
	}
	bt, err := b.svc.Reserve(ctx, batch.ReserveParams{TenantID: "team", KeyID: key, Provider: batch.Anthropic, Plan: plan})
	if err != nil {
		t.Fatal(err)
	}
	sum, err := b.svc.End(ctx, batch.EndParams{TenantID: "team", BatchID: bt.ID, Status: "ended",
		Results: []batch.Result{{CustomID: "a", Succeeded: true, Input: 400, Output: 100}}})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(0, b.now.Load())
	for _, byModel := range []bool{false, true} {
		rows, err := b.svc.Drift(ctx, account.DriftParams{From: now.Add(-time.Hour), To: now.Add(time.Hour), ByModel: byModel})
		if err != nil || len(rows) != 1 {
			t.Fatalf("drift: %+v %v", rows, err)
		}
		r := rows[0]
		tenant := map[bool]string{false: "team", true: "*"}[byModel]
		if !r.Batch || r.TenantID != tenant || r.Model != "gpt-4o" || r.Admissions != 2 || r.Settled != 1 || r.Priced != 2 ||
			r.EstimatedMoneyMicro.String() != fmt.Sprint(plan.MoneyMicro) || r.ActualMoneyMicro.String() != fmt.Sprint(sum.ActualMoney) ||
			r.ActualInput.String() != "400" {
			t.Fatalf("drift row %+v", r)
		}
	}
}

// A batch line of a model without a price is refused where a money window
// must count it (as an admission of it would be), naming the model; the
// same batch is reserved for a tenant without money windows.
func TestBatchOfAnUnpricedModel(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.prices(t)
	key := b.moneyTree(t, 1_000_000_000)
	lines := []batch.Line{{CustomID: "a", Request: chat(t, "gpt-4o", "Hello there", 100)},
		{CustomID: "b", Request: chat(t, "gpt-4.1", "Hello there", 100)}}
	plan, err := b.svc.Plan(ctx, "team", "", lines)
	if err != nil || plan.Unpriced != "gpt-4.1" || plan.Lines[1].MoneyMicro != nil || plan.MoneyMicro != *plan.Lines[0].MoneyMicro {
		t.Fatalf("plan %+v: %v", plan, err)
	}
	_, err = b.svc.Reserve(ctx, batch.ReserveParams{TenantID: "team", KeyID: key, Provider: batch.Anthropic, Plan: plan})
	var inv *rule.InvalidError
	if !errors.As(err, &inv) || inv.Field != "model" {
		t.Fatalf("an unpriced line under a money window: %v", err)
	}
	if _, err := b.svc.SetAllowance(ctx, batch.SetAllowanceParams{TenantID: "acme", Capacity: 1_000_000}); err != nil {
		t.Fatal(err)
	}
	free, err := b.svc.Plan(ctx, "acme", "", lines)
	if err != nil {
		t.Fatal(err)
	}
	bt, err := b.svc.Reserve(ctx, batch.ReserveParams{TenantID: "acme", KeyID: b.key, Provider: batch.Anthropic, Plan: free})
	if err != nil || bt.MoneyMicro != free.MoneyMicro || b.ledgerMoney(t, "acme") != free.MoneyMicro {
		t.Fatalf("without money windows: %+v %v, ledger %d", bt, err, b.ledgerMoney(t, "acme"))
	}
}
