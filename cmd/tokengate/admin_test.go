package main

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/estimator"
	"github.com/tokengate/tokengate/integration/pgtest"
	"github.com/tokengate/tokengate/ledger"
	"github.com/tokengate/tokengate/ledger/ledgertest"
)

func TestAdminCommands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.URL(t)
	pool := pgtest.Pool(t, url, nil)
	must := func(args ...string) (string, string) {
		t.Helper()
		out, notes, err := cli2(t, append(args, "--database-url", url)...)
		if err != nil {
			t.Fatalf("%v: %v (%s)", args, err, notes)
		}
		return out, notes
	}

	out, notes := must("admin-token", "create", "alice")
	secret := strings.TrimSpace(out)
	if !strings.HasPrefix(secret, "tga_") || strings.Contains(notes, secret) {
		t.Fatalf("admin token printed as %q / %q", out, notes)
	}
	tok, err := credential.AdminTokenAuthenticate(ctx, pool, secret)
	if err != nil || tok.Name != "alice" {
		t.Fatalf("printed token does not authenticate: %v", err)
	}
	if out, _ := must("admin-token", "list"); !strings.Contains(out, tok.ID) || strings.Contains(out, secret) {
		t.Fatalf("list: %s", out)
	}
	must("admin-token", "revoke", tok.ID)
	if _, err := credential.AdminTokenAuthenticate(ctx, pool, secret); err == nil {
		t.Fatal("revoked token still works")
	}

	must("tenant", "create", "acme", "--tokens-capacity", "1000", "--tokens-per-second", "0.001") // no refill to speak of: the balances are exact
	must("tenant", "update", "acme", "--tokens-capacity", "500", "--max-concurrent", "3", "--actor", "bob")
	must("tenant", "adjust", "acme", "--tokens=-100", "--reason", "manual correction")
	must("tenant", "disable", "acme", "--reason", "abuse")
	if out, _ := must("tenant", "list"); !strings.Contains(out, "acme") || !strings.Contains(out, "disabled") {
		t.Fatalf("tenant list: %s", out)
	}
	must("tenant", "enable", "acme")
	snap, err := account.NewStore(pool).TenantSnapshot(ctx, "acme")
	if err != nil || snap.Limits.TokensCapacity != 500 || snap.Limits.MaxConcurrent != 3 || snap.Tokens() != 400 || snap.Disabled {
		t.Fatalf("after the commands: %+v %v", snap, err)
	}
	entries, _, err := ledger.EntryQuery(ctx, pool, ledger.Filter{TenantID: "acme", Oldest: true})
	if err != nil || len(entries) != 5 || entries[1].Kind != ledger.KindLimits || entries[1].Actor != "bob" ||
		entries[2].Reason != "manual correction" || entries[3].Reason != "disabled: abuse" {
		t.Fatalf("ledger: %+v %v", entries, err)
	}
	if _, _, err := cli2(t, "tenant", "adjust", "acme", "--tokens=5", "--database-url", url); err == nil {
		t.Fatal("adjust without a reason")
	}

	must("key", "create", "acme")
	out, _ = must("key", "list", "acme")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 {
		t.Fatalf("key list: %s", out)
	}
	must("key", "revoke", "acme", strings.Fields(lines[1])[0])

	must("model", "set", "acme-llm", "--encoding", "cl100k_base", "--input-weight", "0.25", "--output-weight", "3", "--output-cap", "2000", "--context-window", "32000")
	table, err := estimator.LoadTable(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if m, ok := table.Get("acme-llm"); !ok || m.InputWeightMicro != 250_000 || m.OutputWeightMicro != 3_000_000 || m.Encoding != "cl100k_base" {
		t.Fatalf("model: %+v", m)
	}
	if out, _ := must("model", "list"); !strings.Contains(out, "acme-llm") || !strings.Contains(out, "gpt-4o-mini") {
		t.Fatalf("model list: %s", out)
	}
	if _, _, err := cli2(t, "model", "set", "x", "--input-weight", "0", "--database-url", url); err == nil || !strings.Contains(err.Error(), "input-weight") {
		t.Fatalf("zero weight: %v", err)
	}
	must("model", "set", "claude-opus-5-5", "--cache-write-weight", "1.3", "--cache-write-1h-weight", "2.1")
	if table, err = estimator.LoadTable(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if m, ok := table.Get("claude-opus-5-5"); !ok || m.CacheWriteWeightMicro != 1_300_000 || m.CacheWrite1hWeightMicro != 2_100_000 ||
		m.CachedInputWeightMicro != 100_000 || m.ContextWindow != 1_000_000 {
		t.Fatalf("claude-opus-5-5 after --cache-write-weight: %+v", m)
	}
}

// TestLedgerVerifyExitsNonZeroOnOverflow: a balance that wrapped past
// int64, in a chain whose hashes are all valid, makes ledger verify name
// the entry as an overflow and exit non-zero; the report prints the exact
// sums. Before issue 21 verify wrapped the same way and said ok.
func TestLedgerVerifyExitsNonZeroOnOverflow(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	pool := pgtest.Pool(t, url, nil)
	if _, _, err := cli2(t, "tenant", "create", "acme", "--tokens-capacity", "1000", "--tokens-per-second", "1", "--database-url", url); err != nil {
		t.Fatal(err)
	}
	w := ledgertest.Wrap(t, pool, "acme", "gpt-4o")
	out, _, err := cli2(t, "ledger", "verify", "--database-url", url)
	if !errors.Is(err, errVerifyFailed) || !strings.Contains(out, "BROKEN at entry "+strconv.FormatInt(w.OverflowSeq, 10)+" (overflow)") {
		t.Fatalf("verify of a wrapped balance: %q %v", out, err)
	}
	out, _, err = cli2(t, "ledger", "verify", "--json", "--database-url", url)
	if !errors.Is(err, errVerifyFailed) || !strings.Contains(out, `"kind":"overflow"`) || !strings.Contains(out, `"ok":false`) {
		t.Fatalf("verify --json: %q %v", out, err)
	}
	out, _, err = cli2(t, "ledger", "report", "--database-url", url)
	if err != nil || !strings.Contains(out, "9999999999995") || !strings.Contains(out, w.ActualInput.String()) {
		t.Fatalf("report after a wrapped balance: %q %v", out, err)
	}
}

func TestLedgerVerifyExitsNonZeroOnTampering(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	pool := pgtest.Pool(t, url, nil)
	if _, _, err := cli2(t, "tenant", "create", "acme", "--tokens-capacity", "100", "--tokens-per-second", "1", "--database-url", url); err != nil {
		t.Fatal(err)
	}
	out, _, err := cli2(t, "ledger", "verify", "--database-url", url)
	if err != nil || !strings.Contains(out, "acme") || !strings.Contains(out, "ok") {
		t.Fatalf("intact: %q %v", out, err)
	}
	if _, err := pool.Exec(context.Background(), `UPDATE tenants SET tokens_micro = 1 WHERE id = 'acme'`); err != nil {
		t.Fatal(err)
	}
	out, _, err = cli2(t, "ledger", "verify", "--tenant", "acme", "--database-url", url)
	if !errors.Is(err, errVerifyFailed) || !strings.Contains(out, "BROKEN at entry 1") {
		t.Fatalf("tampered: %q %v", out, err)
	}
	out, _, err = cli2(t, "ledger", "report", "--database-url", url)
	if err != nil || !strings.HasPrefix(out, "TENANT") {
		t.Fatalf("report: %q %v", out, err)
	}
}
