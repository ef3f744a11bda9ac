package admin_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/admin"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
	"github.com/tokengate/tokengate/integration/pgtest"
	"github.com/tokengate/tokengate/ledger"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

type testBundle struct {
	svc *admin.Service
	est *estimator.Estimator
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	pool := pgtest.New(t, func(c *pgxpool.Config) { c.MaxConns = 24 })
	est := estimator.New(nil)
	svc, err := admin.New(admin.Config{DB: pool, Estimator: est})
	if err != nil {
		t.Fatal(err)
	}
	return &testBundle{svc: svc, est: est}
}

// together runs fn n times at once, each on its own goroutine released by
// one signal, and returns their errors by index.
func together(n int, fn func(i int) error) []error {
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			errs[i] = fn(i)
		}()
	}
	close(start)
	wg.Wait()
	return errs
}

func model(name string, inputWeight int64) estimator.Model {
	return estimator.Model{Name: name, Encoding: estimator.EncodingO200K, InputWeightMicro: inputWeight,
		OutputWeightMicro: estimator.WeightOne, DefaultOutputTokens: 1000, ContextWindow: 128000, PartTokens: 765}
}

// TestModelCreateConcurrent: of admins creating one model name at once,
// exactly one succeeds, the others get ErrModelExists, one row is stored,
// and this replica's table holds the winner's model.
func TestModelCreateConcurrent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const n = 16
	errs := together(n, func(i int) error {
		return b.svc.ModelCreate(ctx, model("acme-llm", int64(i+1)*estimator.WeightOne), "admin")
	})
	won := -1
	for i, err := range errs {
		switch {
		case err == nil:
			if won >= 0 {
				t.Fatalf("creates %d and %d both succeeded", won, i)
			}
			won = i
		case !errors.Is(err, estimator.ErrModelExists):
			t.Fatalf("create %d: %v, want ErrModelExists", i, err)
		}
	}
	if won < 0 {
		t.Fatal("no create succeeded")
	}
	stored, err := b.svc.ModelList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var rows int
	for _, m := range stored {
		if m.Name == "acme-llm" {
			rows++
			if m.InputWeightMicro != int64(won+1)*estimator.WeightOne {
				t.Fatalf("stored weight %d, want the winner's %d", m.InputWeightMicro, int64(won+1)*estimator.WeightOne)
			}
		}
	}
	if rows != 1 {
		t.Fatalf("%d rows of acme-llm, want 1", rows)
	}
	if m, ok := b.est.Table().Get("acme-llm"); !ok || m.InputWeightMicro != int64(won+1)*estimator.WeightOne {
		t.Fatalf("this replica's table: %+v %v, want the winner's model", m, ok)
	}
}

// TestModelSaveAppliesAtOnce: a saved model is in this replica's table when
// ModelSave returns, and an invalid one changes nothing.
func TestModelSaveAppliesAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	if err := b.svc.ModelSave(ctx, model("gpt-4o", 3*estimator.WeightOne), "admin"); err != nil {
		t.Fatal(err)
	}
	if m, _ := b.est.Table().Get("gpt-4o"); m.InputWeightMicro != 3*estimator.WeightOne {
		t.Fatalf("input weight %d after the save, want %d", m.InputWeightMicro, 3*estimator.WeightOne)
	}
	var inv *estimator.InvalidError
	if err := b.svc.ModelSave(ctx, model("gpt-4o", 0), "admin"); !errors.As(err, &inv) {
		t.Fatalf("a zero weight: %v, want an InvalidError", err)
	}
	if m, _ := b.est.Table().Get("gpt-4o"); m.InputWeightMicro != 3*estimator.WeightOne {
		t.Fatalf("input weight %d after a refused save, want %d", m.InputWeightMicro, 3*estimator.WeightOne)
	}
}

// TestPriceAddConcurrent: of admins adding one model's price for one time
// at once, exactly one row is stored, in the deployment's currency; the
// others are told the row exists.
func TestPriceAddConcurrent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	from := time.Now().Add(time.Hour).Truncate(time.Second)
	const n = 12
	errs := together(n, func(i int) error {
		_, err := b.svc.PriceAdd(ctx, estimator.Price{Model: "acme-llm", EffectiveFrom: from, InputMicro: int64(i + 1),
			OutputMicro: 10, Source: "test", CreatedBy: "admin"})
		return err
	})
	var ok int
	for i, err := range errs {
		var inv *estimator.InvalidError
		switch {
		case err == nil:
			ok++
		case !errors.As(err, &inv):
			t.Fatalf("add %d: %v, want an InvalidError", i, err)
		}
	}
	if ok != 1 {
		t.Fatalf("%d adds succeeded, want 1", ok)
	}
	hist, err := b.svc.PriceHistory(ctx, "acme-llm")
	if err != nil {
		t.Fatal(err)
	}
	if len(hist) != 1 || hist[0].Currency != estimator.DefaultCurrency || !hist[0].EffectiveFrom.Equal(from) {
		t.Fatalf("history %+v, want one row in %s from %s", hist, estimator.DefaultCurrency, from)
	}
}

// TestKeyCreateConcurrent: keys created at once for one tenant each get
// exactly one ledger entry, written with the key, and the tenant's chain
// stays whole.
func TestKeyCreateConcurrent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	if _, err := b.svc.TenantCreate(ctx, account.CreateTenantParams{ID: "acme", Actor: "admin",
		Limits: rule.Limits{TokensCapacity: 1000, TokensRateMicro: rule.Micro}}); err != nil {
		t.Fatal(err)
	}
	const n = 20
	errs := together(n, func(int) error {
		_, _, err := b.svc.KeyCreate(ctx, "acme", nil, "admin")
		return err
	})
	for i, err := range errs {
		if err != nil {
			t.Fatalf("create %d: %v", i, err)
		}
	}
	keys, err := b.svc.KeyList(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	entries, _, err := b.svc.LedgerQuery(ctx, ledger.Filter{TenantID: "acme", Kind: ledger.KindTenant, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	created := map[string]bool{}
	for _, e := range entries {
		if id, ok := strings.CutPrefix(e.Reason, "key created: "); ok {
			created[id] = true
		}
	}
	if len(keys) != n || len(created) != n {
		t.Fatalf("%d keys and %d key entries, want %d of each", len(keys), len(created), n)
	}
	for _, k := range keys {
		if !created[k.ID] {
			t.Fatalf("key %s has no ledger entry", k.ID)
		}
	}
	audit, err := b.svc.LedgerVerify(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if len(audit) != 1 || !audit[0].OK || audit[0].Entries != n+1 {
		t.Fatalf("audit %+v, want acme's chain whole with %d entries", audit, n+1)
	}
	if _, _, err := b.svc.KeyCreate(ctx, "nobody", nil, "admin"); err == nil {
		t.Fatal("a key for a tenant that does not exist")
	}
	if _, err := b.svc.KeyList(ctx, "nobody"); !errors.Is(err, rule.ErrTenantNotFound) {
		t.Fatalf("keys of a tenant that does not exist: %v, want ErrTenantNotFound", err)
	}
}

// TestWindowSpend: without windows nothing is read; with them, one amount
// per window in the deployment's currency.
func TestWindowSpend(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	if sp, err := b.svc.WindowSpend(ctx, rule.Snapshot{TenantID: "acme"}); err != nil || sp.Money != nil || sp.Currency != "" {
		t.Fatalf("no windows: %+v %v, want a zero Spend", sp, err)
	}
	snap, err := b.svc.TenantCreate(ctx, account.CreateTenantParams{ID: "acme", Actor: "admin",
		Limits: rule.Limits{TokensCapacity: 1000, TokensRateMicro: rule.Micro,
			Windows: []rule.WindowLimit{{Name: "daily", Window: rule.Window{Unit: rule.WindowDay}, Counts: rule.CountTokens, Limit: 500}}}})
	if err != nil {
		t.Fatal(err)
	}
	sp, err := b.svc.WindowSpend(ctx, snap, snap)
	if err != nil || len(sp.Money) != 2 || sp.Money[0] != 0 || sp.Currency != estimator.DefaultCurrency {
		t.Fatalf("two windows: %+v %v, want two zero amounts in %s", sp, err, estimator.DefaultCurrency)
	}
}
