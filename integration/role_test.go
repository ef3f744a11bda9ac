package integration_test

import (
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/alert"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/integration/pgtest"
)

// TestAppRoleCannotRewriteLedger runs the service under the role docs/auditors.md
// describes: it admits and settles, but may not UPDATE, DELETE or TRUNCATE
// the ledger, trigger or no trigger.
func TestAppRoleCannotRewriteLedger(t *testing.T) {
	t.Parallel()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	role := "tokengate_app_" + hex.EncodeToString(b)
	quoted := pgx.Identifier{role}.Sanitize()
	// Roles belong to the server, not the database: drop it once the test
	// database (registered next, so cleaned up first) is gone.
	admin := pgtest.Admin(t)
	t.Cleanup(func() { _, _ = admin.Exec(ctx, "DROP ROLE IF EXISTS "+quoted) })
	dbURL := pgtest.URL(t)
	owner := pgtest.Pool(t, dbURL, nil)
	// The grants, as docs/auditors.md lists them.
	for _, stmt := range []string{
		"CREATE ROLE " + quoted + " LOGIN PASSWORD 'app-secret'",
		"GRANT SELECT, INSERT, UPDATE ON tenants, admissions, api_keys, idempotency_keys TO " + quoted,
		"GRANT DELETE ON idempotency_keys TO " + quoted,
		"GRANT SELECT ON goose_db_version TO " + quoted,
		"GRANT SELECT, INSERT ON ledger_rows, ledger_entries TO " + quoted,
		"GRANT SELECT, INSERT, UPDATE, DELETE ON tenant_model_limits, pool_models TO " + quoted,
		"GRANT SELECT, INSERT, UPDATE ON pools, pool_shares TO " + quoted,
		"GRANT SELECT, INSERT, UPDATE ON alert_endpoints, alert_rules, alert_events, alert_attempts TO " + quoted,
		"GRANT SELECT ON rejection_counts TO " + quoted,
		"GRANT SELECT, INSERT, UPDATE, DELETE ON deferred_settles TO " + quoted,
		"GRANT SELECT, INSERT ON model_prices TO " + quoted,
		"GRANT SELECT, UPDATE ON price_book_version TO " + quoted,
		"GRANT SELECT, INSERT, UPDATE, DELETE ON end_user_policies TO " + quoted,
		"GRANT SELECT, INSERT ON models TO " + quoted,
		"GRANT SELECT, INSERT, UPDATE, DELETE ON batches, batch_lines, batch_files, batch_file_lines, batch_allowances TO " + quoted,
		"GRANT SELECT, INSERT, UPDATE ON leases, admission_lease_books, lease_modes TO " + quoted,
		"GRANT USAGE ON SEQUENCE admissions_lease_seq TO " + quoted,
		"GRANT SELECT, INSERT ON lease_groups TO " + quoted,
		"GRANT SELECT, INSERT, UPDATE ON lease_group_states TO " + quoted,
		"GRANT SELECT ON lease_group_admissions TO " + quoted,
	} {
		if _, err := owner.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}

	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(role, "app-secret")
	app := pgtest.Pool(t, u.String(), nil)

	// Tenants are created by an operator (the owner); the service runs as
	// the app role.
	tmp := startReplica(t, app)
	key := (&cluster{pool: owner, store: account.NewStore(owner)}).tenant(t, "acme", 1000, "1")
	// With a pool and model limits, so the app role writes their tables too.
	ownerStore := account.NewStore(owner)
	if err := ownerStore.CreatePool(ctx, "gpu", rule.PoolLimits{TokensCapacity: 1000, TokensRateMicro: rule.Micro}); err != nil {
		t.Fatal(err)
	}
	if err := ownerStore.RoutePool(ctx, "gpt-4o", "gpu"); err != nil {
		t.Fatal(err)
	}
	if _, err := ownerStore.SetModelLimits(ctx, account.SetModelLimitsParams{TenantID: "acme", Limits: rule.ModelLimits{
		Model: "gpt-4o", InputCapacity: 1000, InputRateMicro: rule.Micro, OutputCapacity: 1000, OutputRateMicro: rule.Micro}}); err != nil {
		t.Fatal(err)
	}
	// And an alert rule on a period budget, so the decision writes the
	// outbox, and the app role's dispatcher delivers it.
	received := make(chan string, 1)
	hook := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		received <- r.Header.Get(alert.HeaderEventID)
	}))
	defer hook.Close()
	alertKey := []byte("0123456789abcdef0123456789abcdef")
	ownerAlerts := alert.NewStore(owner, alertKey)
	ownerAlerts.AllowPrivate = true // the hook listens on loopback
	ep, _, err := ownerAlerts.CreateEndpoint(ctx, hook.URL, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := alert.NewStore(owner, alertKey).CreateRule(ctx, alert.RuleParams{TenantID: "acme", EndpointID: ep.ID, Kind: alert.KindPeriodBudget, Thresholds: []int32{1}}); err != nil {
		t.Fatal(err)
	}
	if _, err := owner.Exec(ctx, `UPDATE tenants SET windows = '[{"name":"period","unit":"day","time_zone":"UTC","tokens":1000}]' WHERE id = 'acme'`); err != nil {
		t.Fatal(err)
	}
	code, body := post(t, tmp+"/v1/admissions", key, `{"model":"gpt-4o","prompt":"hi","max_tokens":10}`)
	if code != http.StatusCreated {
		t.Fatalf("admission as the app role: %d %s", code, body)
	}
	appAlerts := alert.NewStore(app, alertKey)
	appAlerts.AllowPrivate = true
	d := &alert.Dispatcher{Store: appAlerts, Replica: "app", Client: hook.Client()}
	if n, err := d.Once(ctx); err != nil || n != 1 {
		t.Fatalf("dispatch as the app role: %d %v", n, err)
	}
	if id := <-received; !strings.HasPrefix(id, "evt_") {
		t.Fatalf("delivered %q", id)
	}
	id := strings.Split(strings.Split(string(body), `"id":"`)[1], `"`)[0]
	if code, body := post(t, tmp+"/v1/admissions/"+id+"/settle", key, `{"usage":{"prompt_tokens":3,"completion_tokens":4}}`); code != http.StatusOK {
		t.Fatalf("settle as the app role: %d %s", code, body)
	}
	// Without the trigger's help too: privileges alone refuse rewrites.
	if _, err := owner.Exec(ctx, "ALTER TABLE ledger_rows DISABLE TRIGGER USER"); err != nil {
		t.Fatal(err)
	}
	for _, stmt := range []string{"UPDATE ledger_rows SET delta_micro = 0", "DELETE FROM ledger_rows", "TRUNCATE ledger_rows"} {
		_, err := app.Exec(ctx, stmt)
		if err == nil || !strings.Contains(err.Error(), "permission denied") {
			t.Fatalf("%s as the app role: %v, want permission denied", stmt, err)
		}
	}
	// The view of every entry (00038) takes inserts only (an older
	// replica's), whoever asks.
	for _, stmt := range []string{"UPDATE ledger_entries SET delta_micro = 0", "DELETE FROM ledger_entries"} {
		for _, as := range []*pgxpool.Pool{app, owner} {
			_, err := as.Exec(ctx, stmt)
			if err == nil || !strings.Contains(err.Error(), "cannot") {
				t.Fatalf("%s: %v, want the view to refuse it", stmt, err)
			}
		}
	}
	if _, err := owner.Exec(ctx, "ALTER TABLE ledger_rows ENABLE TRIGGER USER"); err != nil {
		t.Fatal(err)
	}
	verify(t, owner, "acme")
}
