package admin_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/admin"
	"github.com/tokengate/tokengate/budget/lease"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
	"github.com/tokengate/tokengate/integration/pgtest"
	"github.com/tokengate/tokengate/ledger"
)

// Concurrent sets of one tenant's lease mode from many callers change it
// once: exactly one limits entry, and the chain verifies.
func TestTenantLeaseModeConcurrent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	if _, err := b.svc.TenantCreate(ctx, account.CreateTenantParams{ID: "acme", Limits: rule.Limits{TokensCapacity: 100, TokensRateMicro: rule.Micro}}); err != nil {
		t.Fatal(err)
	}
	if m, err := b.svc.TenantLeaseMode(ctx, "acme"); err != nil || m != lease.ModeOff {
		t.Fatalf("mode of a new tenant: %q, %v", m, err)
	}
	for i, err := range together(16, func(int) error {
		_, err := b.svc.TenantLeaseModeSet(ctx, lease.SetModeParams{TenantID: "acme", Mode: lease.ModeAuto, Actor: "ops"})
		return err
	}) {
		if err != nil {
			t.Fatalf("set %d: %v", i, err)
		}
	}
	if m, err := b.svc.TenantLeaseMode(ctx, "acme"); err != nil || m != lease.ModeAuto {
		t.Fatalf("mode after the sets: %q, %v", m, err)
	}
	entries, _, err := b.svc.LedgerQuery(ctx, ledger.Filter{TenantID: "acme", Kind: ledger.KindLimits})
	if err != nil || len(entries) != 1 || entries[0].Actor != "ops" {
		t.Fatalf("limits entries: %d, %v; want exactly one, by ops", len(entries), err)
	}
	res, err := b.svc.LedgerVerify(ctx, "acme")
	if err != nil || len(res) != 1 || !res[0].OK {
		t.Fatalf("ledger verify: %+v, %v", res, err)
	}
	var le *rule.LimitError
	if _, err := b.svc.TenantLeaseModeSet(ctx, lease.SetModeParams{TenantID: "acme", Mode: "on"}); !errors.As(err, &le) || le.Field != "lease" {
		t.Fatalf("set mode on: %v, want a LimitError on lease", err)
	}
}

// A lease's booking stores its admissions' entries as one record per
// level (00038): 30 admissions made concurrently from one lease of a
// two-level tree and booked by its return are two rows with lease_id, 29
// entries before each row's own. Every reader still sees 30 reserve entries
// per level, and the admin service finds an admission's through its lease.
func TestLeaseBookingIsOneRecordPerLevel(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.New(t, func(c *pgxpool.Config) { c.MaxConns = 12 })
	svc, err := admin.New(admin.Config{DB: pool, Estimator: estimator.New(nil)})
	if err != nil {
		t.Fatal(err)
	}
	acct := account.NewStore(pool)
	for _, tn := range []account.CreateTenantParams{
		{ID: "org", Limits: rule.Limits{TokensCapacity: 100_000, TokensRateMicro: rule.Micro}},
		{ID: "team", Parent: "org", Limits: rule.Limits{TokensCapacity: 50_000, TokensRateMicro: rule.Micro}},
	} {
		if _, err := svc.TenantCreate(ctx, tn); err != nil {
			t.Fatal(err)
		}
		if _, err := svc.TenantLeaseModeSet(ctx, lease.SetModeParams{TenantID: tn.ID, Mode: lease.ModeAuto, Actor: "ops"}); err != nil {
			t.Fatal(err)
		}
	}
	ls, err := lease.New(lease.Config{Store: acct, Holder: "r0", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	j := lease.NewJournal(ls)
	jctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { j.Run(jctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	h := lease.NewHolder(ls, j, lease.HolderConfig{TenantID: "team", SliceMicro: 10_000 * rule.Micro})

	const n = 30
	ids := make([]string, n)
	for i, err := range together(n, func(i int) error {
		ids[i] = rule.NewStoreAdmissionID(time.Now())
		e := estimator.Estimate{Model: "gpt-4o", InputTokens: 50, OutputTokens: 50, Cost: 100, InputWeightMicro: estimator.WeightOne, OutputWeightMicro: estimator.WeightOne}
		return h.Admit(ctx, lease.Admission{Admission: account.Admission{ID: ids[i], TenantID: "team", Estimate: e, Family: account.ModelKey(e)}, CostMicro: 100 * rule.Micro})
	}) {
		if err != nil {
			t.Fatalf("admission %d: %v", i, err)
		}
	}
	leaseID := h.LeaseID()
	if err := h.Return(ctx); err != nil {
		t.Fatal(err)
	}

	rows, err := pool.Query(ctx, `SELECT tenant_id, cardinality(earlier_hashes) FROM ledger_rows WHERE lease_id = $1 ORDER BY tenant_id`, leaseID)
	if err != nil {
		t.Fatal(err)
	}
	type rec struct {
		Tenant  string
		Earlier int
	}
	recs, err := pgx.CollectRows(rows, pgx.RowToStructByPos[rec])
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 || recs[0] != (rec{"org", n - 1}) || recs[1] != (rec{"team", n - 1}) {
		t.Fatalf("the booking's records: %+v, want one per level holding %d entries before its own", recs, n-1)
	}
	for _, tenant := range []string{"org", "team"} {
		es, _, err := svc.LedgerQuery(ctx, ledger.Filter{TenantID: tenant, Kind: ledger.KindReserve, Limit: 1000})
		if err != nil || len(es) != n {
			t.Fatalf("%s: %d reserve entries (%v), want %d", tenant, len(es), err, n)
		}
		res, err := svc.LedgerVerify(ctx, tenant)
		if err != nil || len(res) != 1 || !res[0].OK {
			t.Fatalf("verify %s: %+v %v", tenant, res, err)
		}
	}
	for _, id := range ids {
		es, _, err := svc.LedgerQuery(ctx, ledger.Filter{AdmissionID: id, Oldest: true})
		if err != nil || len(es) != 2 || es[0].AdmissionID != id || es[1].AdmissionID != id || es[0].TenantID == es[1].TenantID {
			t.Fatalf("admission %s's entries: %+v %v, want its reserve at both levels", id, es, err)
		}
	}
}
