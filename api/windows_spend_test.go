package api_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

type spendJSON struct {
	Tenant   string `json:"tenant"`
	Balances struct {
		Windows []struct {
			Name       string       `json:"name"`
			Counts     string       `json:"counts"`
			Used       json.Number  `json:"used"`
			End        string       `json:"end"`
			TimeZone   string       `json:"time_zone"`
			MoneySpent *json.Number `json:"money_spent"`
			Currency   string       `json:"currency"`
		} `json:"windows"`
	} `json:"balances"`
	Children []spendJSON `json:"children"`
}

// Windows that count tokens show what their span cost in money, from the
// ledger, on the admin routes (a tree level counts its descendants'
// admissions), and the tenant's own GET /v1/budget does not pay that query.
func TestAdminWindowsShowMoneySpent(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, nil)
	token := b.admin(t, "ops")
	// gpt-4o at 2.50 in / 10.00 out per million tokens, from an hour ago.
	if _, err := b.pool.Exec(ctx, `INSERT INTO model_prices (model, effective_from, input_micro, output_micro, created_by)
		VALUES ('gpt-4o', now() - interval '1 hour', 2500000, 10000000, 'test')`); err != nil {
		t.Fatal(err)
	}
	win := func(name, unit string, tokens int64) []rule.WindowLimit {
		ws, err := rule.ParseWindows([]rule.WindowJSON{{Name: name, Unit: unit, TimeZone: "Europe/Paris", ResetAt: "00:00", Tokens: &tokens}})
		if err != nil {
			t.Fatal(err)
		}
		return ws
	}
	org := lim(10_000_000, "1000")
	org.Windows = win("daily", "day", 5_000_000)
	if _, err := b.store.CreateTenant(ctx, account.CreateTenantParams{ID: "org", Limits: org}); err != nil {
		t.Fatal(err)
	}
	team := lim(10_000_000, "1000")
	team.Windows = win("monthly", "month", 2_000_000)
	if _, err := b.store.CreateTenant(ctx, account.CreateTenantParams{ID: "team", Parent: "org", Limits: team}); err != nil {
		t.Fatal(err)
	}
	_, key, err := credential.KeyCreate(ctx, b.pool, "team")
	if err != nil {
		t.Fatal(err)
	}
	// 100 000 in at 2.50 + 20 000 out at 10.00 = 0.25 + 0.20 = 0.45 reserved.
	if _, err := b.store.Reserve(ctx, account.ReserveParams{TenantID: "team", Estimate: estimator.Estimate{Model: "gpt-4o",
		InputTokens: 100_000, OutputTokens: 20_000, Cost: 120_000, InputWeightMicro: estimator.WeightOne, OutputWeightMicro: estimator.WeightOne}}); err != nil {
		t.Fatal(err)
	}

	var tree spendJSON
	b.adminCall(t, token, http.MethodGet, "/v1/admin/tenants/team/tree", nil).json(&tree)
	check := func(s spendJSON, name, used string) {
		t.Helper()
		if len(s.Balances.Windows) != 1 {
			t.Fatalf("%s windows %+v", s.Tenant, s.Balances.Windows)
		}
		w := s.Balances.Windows[0]
		if w.Name != name || w.Counts != "tokens" || w.Used.String() != used || w.MoneySpent == nil || w.MoneySpent.String() != "0.45" || w.Currency != "USD" {
			t.Fatalf("%s window %+v (money_spent %v), want %s used %s, 0.45 USD spent", s.Tenant, w, w.MoneySpent, name, used)
		}
		// The reset is shown in the window's zone: Paris in winter is +01:00.
		end, err := time.Parse(time.RFC3339, w.End)
		if err != nil || w.TimeZone != "Europe/Paris" || !strings.HasSuffix(w.End, "+01:00") || end.In(time.UTC).Hour() != 23 {
			t.Fatalf("%s window end %q in %s: %v", s.Tenant, w.End, w.TimeZone, err)
		}
	}
	if tree.Tenant != "org" || len(tree.Children) != 1 {
		t.Fatalf("tree %+v", tree)
	}
	check(tree, "daily", "120000")
	check(tree.Children[0], "monthly", "120000")

	var one spendJSON
	b.adminCall(t, token, http.MethodGet, "/v1/admin/tenants/team", nil).json(&one)
	check(one, "monthly", "120000")
	var list struct {
		Tenants []spendJSON `json:"tenants"`
	}
	b.adminCall(t, token, http.MethodGet, "/v1/admin/tenants", nil).json(&list)
	if len(list.Tenants) != 2 {
		t.Fatalf("list %+v", list)
	}
	for _, s := range list.Tenants {
		check(s, map[string]string{"org": "daily", "team": "monthly"}[s.Tenant], "120000")
	}

	// The caller's own budget does not query the ledger.
	r := b.call(t, key, http.MethodGet, "/v1/budget", "")
	var own spendJSON
	r.json(&own)
	if len(own.Balances.Windows) != 1 || own.Balances.Windows[0].MoneySpent != nil || strings.Contains(r.Body.String(), "money_spent") {
		t.Fatalf("GET /v1/budget: %s", r.Body.String())
	}
}

// An end user's windows show their money spent in the admin API's list of
// end users, as a tenant's do: a money window's equals its used.
func TestAdminEndUsersShowMoneySpent(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, nil)
	token := b.admin(t, "ops")
	if _, err := b.pool.Exec(ctx, `INSERT INTO model_prices (model, effective_from, input_micro, output_micro, created_by)
		VALUES ('gpt-4o', now() - interval '1 hour', 2500000, 10000000, 'test')`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.CreateTenant(ctx, account.CreateTenantParams{ID: "acme", Limits: lim(10_000_000, "1000")}); err != nil {
		t.Fatal(err)
	}
	money := "2"
	tpl := lim(1_000_000, "100")
	ws, err := rule.ParseWindows([]rule.WindowJSON{{Name: "user-daily", Unit: "day", TimeZone: "Asia/Tokyo", Money: &money}})
	if err != nil {
		t.Fatal(err)
	}
	tpl.Windows = ws
	if _, err := b.store.EndUserPolicySet(ctx, account.EndUserPolicyParams{TenantID: "acme", Source: rule.SourceUser, Template: tpl,
		MaxEndUsers: 5, IdleTTL: time.Hour, Actor: "test"}); err != nil {
		t.Fatal(err)
	}
	alice, err := b.store.EndUserEnsure(ctx, "acme", "alice")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Reserve(ctx, account.ReserveParams{TenantID: alice, Estimate: estimator.Estimate{Model: "gpt-4o",
		InputTokens: 100_000, OutputTokens: 20_000, Cost: 120_000, InputWeightMicro: estimator.WeightOne, OutputWeightMicro: estimator.WeightOne}}); err != nil {
		t.Fatal(err)
	}
	var list struct {
		EndUsers []struct {
			EndUserID string    `json:"end_user_id"`
			Budget    spendJSON `json:"budget"`
		} `json:"end_users"`
	}
	b.adminCall(t, token, http.MethodGet, "/v1/admin/tenants/acme/end-users", nil).json(&list)
	if len(list.EndUsers) != 1 || len(list.EndUsers[0].Budget.Balances.Windows) != 1 {
		t.Fatalf("end users %+v", list)
	}
	w := list.EndUsers[0].Budget.Balances.Windows[0]
	if w.Name != "user-daily" || w.Counts != "money" || w.Used.String() != "0.45" || w.MoneySpent == nil || w.MoneySpent.String() != "0.45" ||
		w.Currency != "USD" || w.TimeZone != "Asia/Tokyo" || !strings.HasSuffix(w.End, "+09:00") {
		t.Fatalf("alice's window %+v (money_spent %v)", w, w.MoneySpent)
	}
}
