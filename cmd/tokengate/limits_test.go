package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/integration/pgtest"
)

// TestTenantUpdateBounds: `tenant update` refuses out-of-range values and
// 0 for an optional limit with an error naming the field, changing
// nothing; "none" removes an optional limit; flags not given are kept.
func TestTenantUpdateBounds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.URL(t)
	pool := pgtest.Pool(t, url, nil)
	if _, notes, err := cli2(t, "tenant", "create", "acme", "--database-url", url, "--tokens-capacity", "1000", "--tokens-per-second", "1",
		"--max-concurrent", "4", "--requests-capacity", "10", "--requests-per-second", "2"); err != nil {
		t.Fatalf("create: %v %s", err, notes)
	}
	for _, tc := range []struct {
		args  []string
		field string
	}{
		{[]string{"--max-concurrent", "0"}, "max_concurrent"},
		{[]string{"--max-concurrent=-5"}, "max_concurrent"},
		{[]string{"--max-concurrent", "lots"}, "--max-concurrent"},
		{[]string{"--requests-capacity", "0"}, "requests_capacity"},
		{[]string{"--period-budget", "0", "--period", "day"}, "period_budget"},
		{[]string{"--reservation-ttl", "169h"}, "reservation_ttl_ms"},
		{[]string{"--reservation-ttl", "999ms"}, "reservation_ttl_ms"},
		{[]string{"--max-wait", "11m"}, "max_wait_ms"},
		{[]string{"--max-wait", "100us"}, "max_wait_ms"},
		{[]string{"--tokens-capacity", "0"}, "tokens_capacity"},
	} {
		_, notes, err := cli2(t, append([]string{"tenant", "update", "acme", "--database-url", url}, tc.args...)...)
		if err == nil || !strings.Contains(err.Error()+notes, tc.field) {
			t.Errorf("update %v: %v %q, want an error naming %s", tc.args, err, notes, tc.field)
		}
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM ledger_entries WHERE kind = 'limits'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("%d limits entries after refused updates", n)
	}

	if _, notes, err := cli2(t, "tenant", "update", "acme", "--database-url", url, "--max-concurrent", "none", "--max-wait", "10m"); err != nil {
		t.Fatalf("update: %v %s", err, notes)
	}
	snap, err := account.NewStore(pool).TenantSnapshot(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if l := snap.Limits; l.MaxConcurrent != 0 || l.MaxWait != 10*time.Minute || l.RequestsCapacity != 10 || l.TokensCapacity != 1000 {
		t.Fatalf("after --max-concurrent none --max-wait 10m: %+v", l)
	}
	if _, notes, err := cli2(t, "tenant", "update", "acme", "--database-url", url, "--requests-capacity", "none"); err != nil {
		t.Fatalf("update: %v %s", err, notes)
	}
	if snap, _ := account.NewStore(pool).TenantSnapshot(ctx, "acme"); snap.Limits.RequestsCapacity != 0 || snap.Limits.RequestsRateMicro != 0 {
		t.Fatalf("after --requests-capacity none: %+v", snap.Limits)
	}
}

// TestTenantUpdateLease: `tenant update --lease` sets the lease mode alone
// (no limits entry of the limits' own), says that a tenant in auto is
// admitted from leases, or which rule keeps it exact, and refuses a mode
// that is not one, changing nothing.
func TestTenantUpdateLease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.URL(t)
	pool := pgtest.Pool(t, url, nil)
	if _, notes, err := cli2(t, "tenant", "create", "acme", "--database-url", url, "--tokens-capacity", "1000", "--tokens-per-second", "1",
		"--max-concurrent", "4"); err != nil {
		t.Fatalf("create: %v %s", err, notes)
	}
	for _, bad := range [][]string{{"--lease", "sometimes"}, {"--lease=", "--tokens-capacity", "5"}} {
		if _, notes, err := cli2(t, append([]string{"tenant", "update", "acme", "--database-url", url}, bad...)...); err == nil {
			t.Fatalf("%v: no error (%s)", bad, notes)
		}
	}
	_, notes, err := cli2(t, "tenant", "update", "acme", "--database-url", url, "--lease", "auto")
	if err != nil {
		t.Fatalf("--lease auto: %v %s", err, notes)
	}
	if !strings.Contains(notes, "lease mode auto") || !strings.Contains(notes, "exact mode while acme has a concurrency limit") ||
		strings.Contains(notes, "leases (docs/leasing.md)") || strings.Contains(notes, "updated tenant") {
		t.Fatalf("--lease auto said %q", notes)
	}
	var mode string
	var limits int
	if err := pool.QueryRow(ctx, `SELECT (SELECT mode FROM lease_modes WHERE tenant_id = 'acme'), (SELECT count(*) FROM ledger_entries WHERE kind = 'limits')`).Scan(&mode, &limits); err != nil {
		t.Fatal(err)
	}
	if mode != "auto" || limits != 1 {
		t.Fatalf("mode %q with %d limits entries; want auto with the one of the mode", mode, limits)
	}
	// A tenant no rule keeps exact is admitted from leases.
	if _, notes, err := cli2(t, "tenant", "create", "beta", "--database-url", url, "--tokens-capacity", "1000", "--tokens-per-second", "1"); err != nil {
		t.Fatalf("create: %v %s", err, notes)
	}
	if _, notes, err = cli2(t, "tenant", "update", "beta", "--database-url", url, "--lease", "auto"); err != nil {
		t.Fatalf("--lease auto: %v %s", err, notes)
	}
	if !strings.Contains(notes, "tenant beta: its requests are admitted from its replicas' leases") || strings.Contains(notes, "exact mode while") ||
		strings.Contains(notes, "not use leases") {
		t.Fatalf("--lease auto said %q", notes)
	}
	// --models beside --lease: both are applied, neither hides the other.
	if _, notes, err = cli2(t, "tenant", "update", "acme", "--database-url", url, "--models", "gpt-4o", "--lease", "off"); err != nil {
		t.Fatalf("--models with --lease: %v %s", err, notes)
	}
	if !strings.Contains(notes, "tenant acme: every admission is decided exactly") {
		t.Fatalf("--lease off said %q", notes)
	}
	var models []string
	if err := pool.QueryRow(ctx, `SELECT (SELECT mode FROM lease_modes WHERE tenant_id = 'acme'), (SELECT allowed_models FROM tenants WHERE id = 'acme')`).Scan(&mode, &models); err != nil {
		t.Fatal(err)
	}
	if mode != "off" || len(models) != 1 || models[0] != "gpt-4o" {
		t.Fatalf("after --models gpt-4o --lease off: mode %q, models %v", mode, models)
	}
}
