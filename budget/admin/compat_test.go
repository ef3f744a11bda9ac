package admin_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/admin"
	"github.com/tokengate/tokengate/budget/admission"
	"github.com/tokengate/tokengate/budget/alert"
	"github.com/tokengate/tokengate/budget/batch"
	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/budget/lease"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
	"github.com/tokengate/tokengate/integration/pgtest"
	"github.com/tokengate/tokengate/ledger"
	"github.com/tokengate/tokengate/migrations"
)

// nextReleaseExpand is what the next release's migration may do while this
// release still serves (docs/operators.md, Upgrades): add nullable and NOT
// NULL DEFAULT columns to every table, and add tables. It returns the
// tables it widened.
func nextReleaseExpand(ctx context.Context, t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	// Every ordinary or partitioned table of the public schema, but
	// partitions (their parent's new column reaches them).
	rows, err := pool.Query(ctx, `
		SELECT c.relname
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		JOIN information_schema.tables it ON it.table_schema = n.nspname AND it.table_name = c.relname
		WHERE n.nspname = 'public' AND it.table_type = 'BASE TABLE' AND NOT c.relispartition
		ORDER BY c.relname`)
	if err != nil {
		t.Fatal(err)
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	for _, table := range tables {
		name := pgx.Identifier{table}.Sanitize()
		if _, err := pool.Exec(ctx, fmt.Sprintf(`ALTER TABLE %s ADD COLUMN next_release_note text,
			ADD COLUMN next_release_flag integer NOT NULL DEFAULT 7`, name)); err != nil {
			t.Fatalf("widen %s: %v", table, err)
		}
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE next_release_things (id bigint PRIMARY KEY, tenant_id text REFERENCES tenants (id))`); err != nil {
		t.Fatal(err)
	}
	// The migration is recorded as a version this binary does not know.
	if _, err := pool.Exec(ctx, `INSERT INTO goose_db_version (version_id, is_applied) VALUES (99999, true)`); err != nil {
		t.Fatal(err)
	}
	return tables
}

// TestSurvivesNextReleasesAdditiveMigration: a rolling upgrade migrates the
// schema while this release's replicas still serve. After the next
// release's additive migration (a nullable and a NOT NULL DEFAULT column on
// every table, and a new table), this release's code drives every main
// flow: tenants, keys, gateways, admin tokens and sessions, models and
// prices, model limits, pools, windows and alerts, admissions reserved,
// settled, released and expired, end users, batches, the ledger's listing
// and audit, and the admin service's reads. Before every query named its
// columns, each scan by name failed on the new columns ("struct doesn't
// have corresponding row field").
func TestSurvivesNextReleasesAdditiveMigration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.New(t, func(c *pgxpool.Config) { c.MaxConns = 8 })
	tables := nextReleaseExpand(ctx, t, pool)
	for _, want := range []string{"tenants", "admissions", "ledger_rows", "pools", "pool_shares", "tenant_model_limits",
		"end_user_policies", "models", "model_prices", "gateway_credentials", "api_keys", "alert_rules", "alert_endpoints", "alert_events"} {
		found := false
		for _, table := range tables {
			found = found || table == want
		}
		if !found {
			t.Fatalf("table %s was not widened (widened: %v)", want, tables)
		}
	}

	now := &atomic.Int64{}
	now.Store(time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC).UnixNano())
	store := account.NewStore(pool).WithClock(func() time.Time { return time.Unix(0, now.Load()).UTC() })
	est := estimator.New(nil)
	alerts := alert.NewStore(pool, []byte("0123456789abcdef0123456789abcdef"))
	batches, err := batch.New(batch.Config{Store: store})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := admin.New(admin.Config{DB: pool, Store: store, Estimator: est, Alerts: alerts, Batches: batches})
	if err != nil {
		t.Fatal(err)
	}
	adm := admission.New(admission.Config{Store: store, Pool: pool})
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s after the next release's migration: %v", what, err)
		}
	}

	// Models and prices.
	must("model save", svc.ModelSave(ctx, model("gpt-4o", estimator.WeightOne), "admin"))
	ms, err := svc.ModelList(ctx)
	must("model list", err)
	if len(ms) == 0 {
		t.Fatal("model list: empty after a save")
	}
	from := time.Now().Add(time.Hour).Truncate(time.Second)
	_, err = svc.PriceAdd(ctx, estimator.Price{Model: "gpt-4o", EffectiveFrom: from, InputMicro: 2, OutputMicro: 8, Source: "test", CreatedBy: "admin"})
	must("price add", err)
	hist, err := svc.PriceHistory(ctx, "gpt-4o")
	must("price history", err)
	list, err := svc.PriceList(ctx, "", "", from)
	must("price list", err)
	at, err := estimator.PriceAt(ctx, pool, "gpt-4o", from)
	must("price at", err)
	book, err := estimator.PriceBookLoad(ctx, pool)
	must("price book", err)
	if _, ok := book.At("gpt-4o", from); len(hist) != 1 || len(list) != 1 || at.OutputMicro != 8 || !ok {
		t.Fatalf("prices: history %d, list %d, at %+v, book %v", len(hist), len(list), at, ok)
	}

	// Tenants: a tree with windows and thresholds, and one for end users
	// and batches.
	day, err := rule.ParseWindow("day", "UTC", "", "")
	must("window", err)
	limits := rule.Limits{TokensCapacity: 1_000_000, TokensRateMicro: rule.Micro, Windows: []rule.WindowLimit{
		{Name: "daily", Window: day, Counts: rule.CountTokens, Limit: 5000, Thresholds: []int64{1}}}}
	_, err = svc.TenantCreate(ctx, account.CreateTenantParams{ID: "acme", Limits: limits, Actor: "admin"})
	must("tenant create", err)
	_, err = svc.TenantCreate(ctx, account.CreateTenantParams{ID: "acme-team", Parent: "acme", Limits: rule.Limits{TokensCapacity: 1000, TokensRateMicro: rule.Micro}, Actor: "admin"})
	must("child tenant create", err)
	_, err = svc.TenantCreate(ctx, account.CreateTenantParams{ID: "solo", Limits: rule.Limits{TokensCapacity: 1_000_000, TokensRateMicro: rule.Micro}, Actor: "admin"})
	must("tenant create", err)
	_, err = svc.TenantAdjust(ctx, account.AdjustParams{TenantID: "acme-team", Tokens: -10, Reason: "test", Actor: "admin"})
	must("tenant adjust", err)
	_, err = svc.TenantSetDisabled(ctx, account.SetDisabledParams{TenantID: "acme-team", Disabled: true, Reason: "test", Actor: "admin"})
	must("tenant disable", err)
	_, err = svc.TenantModelsSet(ctx, account.SetModelsParams{TenantID: "solo", Models: []string{"gpt-4o", "gpt-4o-mini"}, Actor: "admin"})
	must("tenant models", err)
	tree, err := svc.TenantTree(ctx, "acme")
	must("tenant tree", err)
	if len(tree.Children) != 1 || !tree.Children[0].Snapshot.Disabled {
		t.Fatalf("tree %+v", tree)
	}
	_, err = svc.TenantLeaseModeSet(ctx, lease.SetModeParams{TenantID: "solo", Mode: lease.ModeOff, Actor: "admin"})
	must("lease mode set", err)
	_, err = svc.TenantLeaseMode(ctx, "solo")
	must("lease mode", err)

	// Credentials.
	key, _, err := svc.KeyCreate(ctx, "acme", nil, "admin")
	must("key create", err)
	must("key priority", svc.KeySetPriority(ctx, "acme", key.ID, rule.PriorityStandard, "admin"))
	keys, err := svc.KeyList(ctx, "acme")
	must("key list", err)
	soloKey, _, err := svc.KeyCreate(ctx, "solo", nil, "admin")
	must("key create", err)
	_, gwSecret, err := svc.GatewayCreate(ctx, "edge", []string{"acme"})
	must("gateway create", err)
	gws, err := svc.GatewayList(ctx)
	must("gateway list", err)
	g, err := credential.GatewayAuthenticate(ctx, pool, gwSecret)
	must("gateway get", err)
	_, secret, err := svc.AdminTokenCreate(ctx, "ops")
	must("admin token create", err)
	toks, err := svc.AdminTokenList(ctx)
	must("admin token list", err)
	cookie, _, err := svc.Login(ctx, secret, time.Hour)
	must("login", err)
	_, err = svc.Session(ctx, cookie)
	must("session", err)
	if len(keys) != 1 || len(gws) != 1 || g.Name != "edge" || len(toks) != 1 {
		t.Fatalf("credentials: %d keys, %d gateways (%+v), %d admin tokens", len(keys), len(gws), g, len(toks))
	}

	// Model limits, a pool, an alert rule.
	_, err = svc.ModelLimitsSet(ctx, account.SetModelLimitsParams{TenantID: "acme", Limits: rule.ModelLimits{Model: "gpt-4o",
		InputCapacity: 1_000_000, InputRateMicro: rule.Micro, OutputCapacity: 1_000_000, OutputRateMicro: rule.Micro}, Actor: "admin"})
	must("model limits set", err)
	mls, err := svc.ModelLimitsList(ctx, "acme")
	must("model limits list", err)
	must("pool create", svc.PoolCreate(ctx, "gpu", rule.PoolLimits{TokensCapacity: 1_000_000, TokensRateMicro: rule.Micro}, "gpt-4o"))
	must("pool weight", svc.PoolSetWeight(ctx, "gpu", "acme", 2))
	ep, _, err := svc.AlertEndpointCreate(ctx, "https://example.com/hook", "")
	must("alert endpoint create", err)
	_, err = svc.AlertRuleCreate(ctx, alert.RuleParams{TenantID: "acme", EndpointID: ep.ID, Kind: alert.KindPeriodBudget, Thresholds: []int32{1}})
	must("alert rule create", err)
	rules, err := svc.AlertRuleList(ctx, "acme")
	must("alert rule list", err)
	eps, err := svc.AlertEndpointList(ctx)
	must("alert endpoint list", err)
	if len(mls) != 1 || len(rules) != 1 || len(eps) != 1 {
		t.Fatalf("%d model limits, %d rules, %d endpoints", len(mls), len(rules), len(eps))
	}

	// Admissions: reserved then settled, reserved (by Idempotency-Key) then
	// released, reserved then expired by the sweep.
	req := func(tenant, keyID, model string, cost int64) admission.Request {
		return admission.Request{Face: rule.FaceProxy, ReserveParams: account.ReserveParams{TenantID: tenant, KeyID: keyID,
			Estimate: estimator.Estimate{Model: model, Family: model, InputTokens: cost / 2, OutputTokens: cost - cost/2, Cost: cost,
				InputWeightMicro: estimator.WeightOne, OutputWeightMicro: estimator.WeightOne}}}
	}
	r1, _, err := adm.Reserve(ctx, req("acme", key.ID, "gpt-4o", 100))
	must("reserve", err)
	if r1.Pool == nil {
		t.Fatal("the reservation did not draw on the pool")
	}
	_, _, err = adm.Settle(ctx, rule.FaceProxy, account.SettleParams{TenantID: "acme", AdmissionID: r1.AdmissionID, InputTokens: 40, OutputTokens: 30})
	must("settle", err)
	idem := req("acme", key.ID, "gpt-4o", 50)
	idem.IdempotencyKey, idem.RequestHash = "idem-1", make([]byte, 32)
	r2, _, err := adm.Reserve(ctx, idem)
	must("reserve with a key", err)
	_, _, err = adm.Release(ctx, rule.FaceProxy, account.ReleaseParams{TenantID: "acme", AdmissionID: r2.AdmissionID})
	must("release", err)
	r3, _, err := adm.Reserve(ctx, req("acme", key.ID, "gpt-4o", 20))
	must("reserve", err)
	now.Add(int64(24 * time.Hour))
	swept, err := adm.SweepOnce(ctx)
	must("sweep", err)
	a1, err := svc.Admission(ctx, "acme", r1.AdmissionID)
	must("admission get", err)
	a3, err := svc.Admission(ctx, "acme", r3.AdmissionID)
	must("admission get", err)
	recent, err := svc.AdmissionRecent(ctx, "acme", 10)
	must("admission recent", err)
	if swept != 1 || a1.State != account.StateSettled || a3.State != account.StateExpired || len(recent) != 3 {
		t.Fatalf("swept %d; states %s %s; %d recent", swept, a1.State, a3.State, len(recent))
	}
	pools, err := svc.PoolList(ctx)
	must("pool list", err)
	p, err := svc.Pool(ctx, "gpu")
	must("pool get", err)
	if len(pools) != 1 || p.ID != "gpu" {
		t.Fatalf("pools %+v, pool %+v", pools, p)
	}
	events, err := svc.AlertEventList(ctx, alert.EventFilter{TenantID: "acme", Limit: 100})
	must("alert events", err)
	if len(events) == 0 {
		t.Fatal("no threshold event raised by the settled admission")
	}

	// End users.
	_, err = svc.EndUserPolicySet(ctx, account.EndUserPolicyParams{TenantID: "solo", Source: rule.SourceUser,
		Template: rule.Limits{TokensCapacity: 500, TokensRateMicro: rule.Micro}, MaxEndUsers: 5, IdleTTL: time.Hour, Actor: "admin"})
	must("end-user policy set", err)
	_, err = svc.EndUserPolicyGet(ctx, "solo")
	must("end-user policy get", err)
	eu := req("solo", soloKey.ID, "gpt-4o-mini", 30)
	eu.EndUser = admission.EndUser{Fields: estimator.EndUserFields{User: "user-1"}}
	r4, _, err := adm.Reserve(ctx, eu)
	must("end-user reserve", err)
	_, _, err = adm.Settle(ctx, rule.FaceProxy, account.SettleParams{TenantID: "solo", AdmissionID: r4.AdmissionID, InputTokens: 10, OutputTokens: 10})
	must("end-user settle", err)
	users, err := svc.EndUserList(ctx, "solo", "", 10)
	must("end-user list", err)
	if len(users) != 1 {
		t.Fatalf("%d end users, want 1", len(users))
	}

	// A batch: planned, recorded, reserved and ended.
	_, err = svc.BatchAllowanceSet(ctx, batch.SetAllowanceParams{TenantID: "solo", Capacity: 100_000})
	must("batch allowance", err)
	var lines []batch.Line
	for i := range 3 {
		r, err := estimator.Parse(fmt.Appendf(nil, `{"model":"gpt-4o","messages":[{"role":"user","content":"line %d"}],"max_tokens":50}`, i))
		must("parse", err)
		lines = append(lines, batch.Line{CustomID: fmt.Sprintf("r%d", i), Request: r})
	}
	plan, err := batches.Plan(ctx, "solo", "", lines)
	must("batch plan", err)
	must("batch file", batches.FileRecord(ctx, batch.FileParams{Provider: batch.OpenAI, FileID: "file-1", TenantID: "solo", Endpoint: "/v1/chat/completions", Plan: plan}))
	bt, err := batches.Reserve(ctx, batch.ReserveParams{TenantID: "solo", KeyID: soloKey.ID, Provider: batch.OpenAI, FileID: "file-1", Actor: "test"})
	must("batch reserve", err)
	sum, err := batches.End(ctx, batch.EndParams{TenantID: "solo", BatchID: bt.ID, Status: "completed", Actor: "test", Results: []batch.Result{
		{CustomID: "r0", Succeeded: true, Input: 5, Output: 5}, {CustomID: "r1", Succeeded: true, Input: 5, Output: 5}, {CustomID: "r2"}}})
	must("batch end", err)
	if sum.Settled != 2 || sum.Refunded != 1 {
		t.Fatalf("batch summary %+v", sum)
	}
	_, err = svc.BatchAllowance(ctx, "solo")
	must("batch allowance get", err)

	// The admin service's reads, the ledger and its audit.
	snaps, err := svc.TenantList(ctx)
	must("tenant list", err)
	snap, err := svc.Tenant(ctx, "acme")
	must("tenant get", err)
	_, err = svc.WindowSpend(ctx, snap)
	must("window spend", err)
	_, err = svc.Activity(ctx, time.Unix(0, now.Load()), 60)
	must("activity", err)
	_, err = svc.DriftReport(ctx, account.DriftParams{TenantID: "acme", From: time.Unix(0, now.Load()).Add(-48 * time.Hour), To: time.Unix(0, now.Load()).Add(time.Hour)})
	must("drift report", err)
	if len(snaps) != 3 || snap.OpenReservations != 0 || snap.LedgerSeq < 6 {
		t.Fatalf("%d tenants; acme %+v", len(snaps), snap)
	}
	es, _, err := svc.LedgerQuery(ctx, ledger.Filter{Limit: 1000})
	must("ledger query", err)
	asc, _, err := svc.LedgerQuery(ctx, ledger.Filter{TenantID: "acme", Oldest: true, Limit: 1000})
	must("ledger query", err)
	audit, err := svc.LedgerVerify(ctx, "")
	must("ledger verify", err)
	if len(es) < 10 || len(asc) == 0 || len(audit) < 3 {
		t.Fatalf("%d entries, %d of acme, %d audited", len(es), len(asc), len(audit))
	}
	for _, a := range audit {
		if !a.OK {
			t.Fatalf("audit after the next release's migration: %+v", a)
		}
	}

	// Readiness: a schema ahead of this binary is not pending, so its
	// replicas stay in the load balancer while the next release rolls out.
	m, err := migrations.New(pool, nil)
	must("migrator", err)
	defer m.Close()
	must("schema check", m.Check(ctx))
}
