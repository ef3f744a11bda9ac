package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
	"github.com/tokengate/tokengate/integration/pgtest"
)

// Windows from the CLI: --window specs on create, replaced or removed on
// update, each error naming the window's field, and the listing showing
// used of limit, the ceiling of a soft budget, the money spent and the next
// reset in the window's zone.
func TestTenantWindowsFromTheCLI(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.URL(t)
	pool := pgtest.Pool(t, url, nil)
	store := account.NewStore(pool)
	must := func(args ...string) string {
		t.Helper()
		out, errOut, err := cli2(t, append(args, "--database-url", url)...)
		if err != nil {
			t.Fatalf("%v: %v\n%s", args, err, errOut)
		}
		return out
	}
	must("tenant", "create", "acme", "--tokens-capacity", "10000000", "--tokens-per-second", "1000",
		"--window", "name=daily,unit=day,zone=Europe/Paris,reset=09:00,money=25.50,overage=10,thresholds=50/80/100",
		"--window", "name=weekly,unit=week,zone=America/New_York,week=sunday,tokens=1000000")
	snap, err := store.TenantSnapshot(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	ws := snap.Limits.Windows
	if len(ws) != 2 || ws[0].Name != "daily" || ws[0].Counts != rule.CountMoney || ws[0].Limit != 25_500_000 || ws[0].OveragePercent != 10 ||
		ws[0].ResetAt != 9*time.Hour || ws[0].Location.String() != "Europe/Paris" || len(ws[0].Thresholds) != 3 ||
		ws[1].Name != "weekly" || ws[1].Counts != rule.CountTokens || ws[1].Limit != 1_000_000 || ws[1].WeekStart != time.Sunday {
		t.Fatalf("windows %+v", ws)
	}

	for _, bad := range []struct{ spec, field string }{
		{"name=d,unit=day,money=abc", "windows[0].money"},
		{"name=d,unit=fortnight,tokens=5", "windows[0].unit"},
		{"name=d,unit=day,zone=Mars/Olympus,tokens=5", "windows[0].time_zone"},
		{"name=d,unit=day,reset=25:00,tokens=5", "windows[0].reset_at"},
		{"name=d,unit=day", "windows[0].tokens"},
		{"name=d,unit=day,tokens=5,colour=red", "windows[0].colour"},
		{"name=d,unit=day,tokens=5,thresholds=50/x", "windows[0].thresholds"},
		{"name=D D,unit=day,tokens=5", "windows[0].name"},
	} {
		_, _, err := cli2(t, "tenant", "create", "x", "--tokens-capacity", "10", "--tokens-per-second", "1", "--window", bad.spec, "--database-url", url)
		if err == nil || !strings.Contains(err.Error(), bad.field) {
			t.Errorf("create --window %s: %v, want an error naming %s", bad.spec, err, bad.field)
		}
	}
	if _, _, err := cli2(t, "tenant", "update", "acme", "--window", "name=a,unit=day,tokens=1", "--window", "name=a,unit=hour,tokens=1", "--database-url", url); err == nil ||
		!strings.Contains(err.Error(), "windows[1].name") {
		t.Errorf("two windows named alike: %v", err)
	}
	if _, _, err := cli2(t, "tenant", "update", "acme", "--window", "name=a,unit=day,tokens=1", "--no-windows", "--database-url", url); err == nil {
		t.Error("--window with --no-windows succeeded")
	}
	if _, err := account.NewStore(pool).TenantSnapshot(ctx, "x"); err == nil {
		t.Fatal("a refused create made the tenant")
	}

	// 100 000 in at 2.50 + 20 000 out at 10.00 per million = 0.45.
	if _, err := pool.Exec(ctx, `INSERT INTO model_prices (model, effective_from, input_micro, output_micro, created_by)
		VALUES ('gpt-4o', now() - interval '1 hour', 2500000, 10000000, 'test')`); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Reserve(ctx, account.ReserveParams{TenantID: "acme", Estimate: estimator.Estimate{Model: "gpt-4o",
		InputTokens: 100_000, OutputTokens: 20_000, Cost: 120_000, InputWeightMicro: estimator.WeightOne, OutputWeightMicro: estimator.WeightOne}}); err != nil {
		t.Fatal(err)
	}
	out := must("tenant", "list")
	now := time.Now()
	daily := ws[0].Next(now).In(ws[0].Location).Format("2006-01-02 15:04 MST") + " (Europe/Paris)"
	weekly := ws[1].Next(now).In(ws[1].Location).Format("2006-01-02 15:04 MST") + " (America/New_York)"
	for _, want := range []string{
		"WINDOW", "daily", "money per day", "0.45 USD / 25.50 USD", "28.05 USD (+10%)", daily,
		"weekly", "tokens per week", "120000 / 1000000", weekly,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("tenant list lacks %q:\n%s", want, out)
		}
	}
	if !strings.HasSuffix(daily, "09:00 CET (Europe/Paris)") || !strings.Contains(weekly, "00:00 EST") {
		t.Errorf("resets %q, %q: want 09:00 in Paris and midnight in New York", daily, weekly)
	}
	// The tokens window shows what its span cost too: both spans hold the
	// one admission.
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "weekly") && !strings.Contains(line, "0.45 USD") {
			t.Errorf("the weekly tokens window's spend is not shown: %q", line)
		}
	}
	if show := must("tenant", "show", "acme"); !strings.Contains(show, "0.45 USD / 25.50 USD") || !strings.Contains(show, weekly) {
		t.Errorf("tenant show lacks the windows:\n%s", show)
	}
	if _, _, err := cli2(t, "tenant", "show", "nobody", "--database-url", url); err == nil {
		t.Error("tenant show of a missing tenant succeeded")
	}
	if tree := must("tenant", "tree", "acme"); !strings.Contains(tree, "0.45 USD / 25.50 USD") || !strings.Contains(tree, daily) {
		t.Errorf("tenant tree lacks the windows:\n%s", tree)
	}

	// --window replaces the list; a window keeping its name and calendar
	// keeps what it used.
	must("tenant", "update", "acme", "--window", "name=daily,unit=day,zone=Europe/Paris,reset=09:00,money=30")
	snap, err = store.TenantSnapshot(ctx, "acme")
	if err != nil || len(snap.Windows) != 1 || snap.Windows[0].Limit != 30_000_000 || snap.Windows[0].Used != 450_000 || snap.Windows[0].OveragePercent != 0 {
		t.Fatalf("after --window: %+v %v", snap.Windows, err)
	}
	must("tenant", "update", "acme", "--no-windows")
	snap, err = store.TenantSnapshot(ctx, "acme")
	if err != nil || len(snap.Limits.Windows) != 0 || len(snap.Windows) != 0 {
		t.Fatalf("after --no-windows: %+v %v", snap.Limits.Windows, err)
	}
	if out := must("tenant", "list"); strings.Contains(out, "WINDOW") {
		t.Errorf("a listing of no windows shows a windows table:\n%s", out)
	}
}

// End users' windows from the CLI: the policy's template takes --window,
// each end user gets it, and end-users list prints each one's windows with
// what its span cost and its next reset in its zone.
func TestEndUserWindowsFromTheCLI(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.URL(t)
	pool := pgtest.Pool(t, url, nil)
	store := account.NewStore(pool)
	must := func(args ...string) string {
		t.Helper()
		out, errOut, err := cli2(t, append(args, "--database-url", url)...)
		if err != nil {
			t.Fatalf("%v: %v\n%s", args, err, errOut)
		}
		return out
	}
	must("tenant", "create", "acme", "--tokens-capacity", "10000000", "--tokens-per-second", "1000")
	if _, _, err := cli2(t, "end-users", "policy", "set", "acme", "--source", "user", "--max-end-users", "5", "--tokens-capacity", "1000000",
		"--tokens-per-second", "100", "--window", "name=user-daily,unit=day,zone=Asia/Tokyo,reset=06:00,money=nope", "--database-url", url); err == nil ||
		!strings.Contains(err.Error(), "windows[0].money") {
		t.Fatalf("a bad template window: %v", err)
	}
	must("end-users", "policy", "set", "acme", "--source", "user", "--max-end-users", "5", "--tokens-capacity", "1000000",
		"--tokens-per-second", "100", "--window", "name=user-daily,unit=day,zone=Asia/Tokyo,reset=06:00,money=2")
	alice, err := store.EndUserEnsure(ctx, "acme", "alice")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO model_prices (model, effective_from, input_micro, output_micro, created_by)
		VALUES ('gpt-4o', now() - interval '1 hour', 2500000, 10000000, 'test')`); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Reserve(ctx, account.ReserveParams{TenantID: alice, Estimate: estimator.Estimate{Model: "gpt-4o",
		InputTokens: 100_000, OutputTokens: 20_000, Cost: 120_000, InputWeightMicro: estimator.WeightOne, OutputWeightMicro: estimator.WeightOne}}); err != nil {
		t.Fatal(err)
	}
	snap, err := store.TenantSnapshot(ctx, alice)
	if err != nil || len(snap.Windows) != 1 {
		t.Fatalf("alice's windows %+v: %v", snap.Windows, err)
	}
	reset := snap.Windows[0].End.In(snap.Windows[0].Location).Format("2006-01-02 15:04 MST") + " (Asia/Tokyo)"
	out := must("end-users", "list", "acme")
	for _, want := range []string{alice, "user-daily", "money per day", "0.45 USD / 2.00 USD", reset} {
		if !strings.Contains(out, want) {
			t.Errorf("end-users list lacks %q:\n%s", want, out)
		}
	}
	if !strings.Contains(reset, "06:00 JST") {
		t.Errorf("reset %q: want 06:00 in Tokyo", reset)
	}
}
