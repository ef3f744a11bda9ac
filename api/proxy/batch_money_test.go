package proxy_test

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/batch"
	"github.com/tokengate/tokengate/budget/rule"
)

// A batch counts in the tenant's money budget, through the SDK: its money
// at the batch price (gpt-4o has no batch row: half its default price) is
// reserved with it; a second batch the monthly money window cannot hold
// is refused with a 429 in OpenAI's shape naming the window, and never
// reaches the upstream; when the first ends, its lines are charged what
// they used, cached input at the cached price, and the window counts
// exactly that.
func TestBatchCountsInTheMoneyBudget(t *testing.T) {
	t.Parallel()
	b := setupBatches(t, 100_000)
	if _, err := b.pool.Exec(ctx, `INSERT INTO model_prices (model, effective_from, input_micro, output_micro, cached_input_micro, created_by)
		VALUES ('gpt-4o', $1, 2500000, 10000000, 1250000, 'test')`, time.Now().Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	f, err := b.upload(t, chatLine("a", "gpt-4o", 100), chatLine("b", "gpt-4o", 100))
	if err != nil {
		t.Fatal(err)
	}
	rec, err := b.svc.FileOf(ctx, batch.OpenAI, f.ID, "acme")
	if err != nil || rec.MoneyMicro <= 0 || rec.Unpriced != "" {
		t.Fatalf("file %+v: %v", rec, err)
	}
	month, _ := rule.ParseWindow("month", "UTC", "", "")
	windows := []rule.WindowLimit{{Name: "spend", Window: month, Counts: rule.CountMoney, Limit: rec.MoneyMicro + rec.MoneyMicro/2}}
	if _, err := b.store.UpdateLimits(ctx, account.UpdateLimitsParams{TenantID: "acme", Patch: rule.LimitsPatch{Windows: rule.Set(windows)}}); err != nil {
		t.Fatal(err)
	}
	spent := func() int64 {
		s, err := b.store.TenantSnapshot(ctx, "acme")
		if err != nil {
			t.Fatal(err)
		}
		return s.Windows[0].Used
	}
	bt, err := b.create(t, f.ID)
	if err != nil {
		t.Fatal(err)
	}
	if spent() != rec.MoneyMicro {
		t.Fatalf("the window counts %d, want the batch's %d", spent(), rec.MoneyMicro)
	}
	b.up.mu.Lock()
	upstream := len(b.up.batches)
	b.up.mu.Unlock()
	_, err = b.create(t, f.ID)
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusTooManyRequests || apiErr.Code != "insufficient_quota" ||
		!strings.Contains(apiErr.Message, "spend") {
		t.Fatalf("a batch over the money window: %v", err)
	}
	b.up.mu.Lock()
	reached := len(b.up.batches) - upstream
	b.up.mu.Unlock()
	if reached != 0 || spent() != rec.MoneyMicro || b.enqueued(t) != b.reservedOf(t, chatLine("a", "gpt-4o", 100))+b.reservedOf(t, chatLine("b", "gpt-4o", 100)) {
		t.Fatalf("the refused batch reached the upstream (%d) or took money (%d) or allowance (%d)", reached, spent(), b.enqueued(t))
	}
	// Each line used 5 input tokens, 3 of them cached, and 7 output: at
	// half of 2.50, 1.25 and 10.00 per million.
	b.up.end(bt.ID, "completed", nil, 2)
	if got, err := b.client.Batches.Get(ctx, bt.ID); err != nil || got.Status != "completed" {
		t.Fatalf("completed batch: %v %v", got, err)
	}
	line := (2*1_250_000 + 3*625_000 + 7*5_000_000 + 999_999) / 1_000_000
	var ledgerMoney int64
	if err := b.pool.QueryRow(ctx, `SELECT coalesce(sum(money_micro), 0) FROM ledger_entries WHERE tenant_id = 'acme'`).Scan(&ledgerMoney); err != nil {
		t.Fatal(err)
	}
	if want := int64(2 * line); spent() != want || ledgerMoney != want {
		t.Fatalf("the window counts %d, the ledger %d; want %d", spent(), ledgerMoney, want)
	}
	// The replica's batch metrics count what happened.
	for _, c := range []struct {
		name, label, value string
		want               float64
	}{
		{"tokengate_batches_created_total", "provider", "openai", 1}, {"tokengate_batches_created_total", "provider", "anthropic", 0},
		{"tokengate_batches_refused_total", "", "", 1}, {"tokengate_batches_ended_total", "outcome", "completed", 1},
		{"tokengate_batch_lines_settled_total", "", "", 2}, {"tokengate_batch_lines_refunded_total", "", "", 0},
	} {
		if got := metricValue(t, b.reg, c.name, c.label, c.value); got != c.want {
			t.Errorf("%s{%s=%q} = %v, want %v", c.name, c.label, c.value, got, c.want)
		}
	}
}

// metricValue is a counter's value in reg: of the series whose label
// has value (any series when label is "").
func metricValue(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if label == "" {
				return m.GetCounter().GetValue()
			}
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no %s{%s=%q}", name, label, value)
	return 0
}
