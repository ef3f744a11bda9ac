package main

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
	"github.com/tokengate/tokengate/integration/pgtest"
)

func cli2(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err := run(context.Background(), append(args, "--log-level", "error"), &out, &errOut)
	return out.String(), errOut.String(), err
}

func TestTenantAndKeyCreate(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	_, _, err := cli2(t, "tenant", "create", "acme", "--database-url", url,
		"--tokens-capacity", "5000", "--tokens-per-second", "2.5",
		"--requests-capacity", "60", "--requests-per-second", "1",
		"--max-concurrent", "4", "--period-budget", "100000", "--period", "month")
	if err != nil {
		t.Fatal(err)
	}
	pool := pgtest.Pool(t, url, nil)
	snap, err := account.NewStore(pool).TenantSnapshot(context.Background(), "acme")
	if err != nil {
		t.Fatal(err)
	}
	l := snap.Limits
	if l.TokensCapacity != 5000 || l.TokensRateMicro != 2_500_000 || l.RequestsCapacity != 60 || l.MaxConcurrent != 4 ||
		l.PeriodBudget != 100000 || l.Period != rule.PeriodMonth || snap.Tokens() != 5000 {
		t.Fatalf("created %+v", snap)
	}
	if _, _, err := cli2(t, "tenant", "create", "acme", "--database-url", url, "--tokens-capacity", "1", "--tokens-per-second", "1"); err == nil {
		t.Fatal("a second create of the same id succeeded")
	}
	if _, _, err := cli2(t, "tenant", "create", "acme", "--database-url", url, "--tokens-capacity", "1", "--tokens-per-second", "1", "--if-not-exists"); err != nil {
		t.Fatalf("--if-not-exists: %v", err)
	}
	for _, bad := range [][]string{
		{"tenant", "create", "Bad ID", "--tokens-capacity", "1", "--tokens-per-second", "1"},
		{"tenant", "create", "x", "--tokens-capacity", "0", "--tokens-per-second", "1"},
		{"tenant", "create", "x", "--tokens-capacity", "10", "--tokens-per-second", "-1"},
		{"tenant", "create", "x", "--tokens-capacity", "10", "--tokens-per-second", "1", "--period-budget", "5"},
		{"tenant", "create", "x", "--tokens-capacity", "10", "--tokens-per-second", "1", "--period", "week"},
	} {
		if _, _, err := cli2(t, append(bad, "--database-url", url)...); err == nil {
			t.Errorf("%v succeeded", bad)
		}
	}

	out, notes, err := cli2(t, "key", "create", "acme", "--database-url", url)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 1 || !strings.HasPrefix(lines[0], "tg_") {
		t.Fatalf("stdout %q: want the key alone on one line", out)
	}
	if strings.Contains(notes, lines[0]) {
		t.Fatal("the secret was printed twice")
	}
	if tenant, _, err := credential.KeyAuthenticate(context.Background(), pool, lines[0]); err != nil || tenant != "acme" {
		t.Fatalf("the printed key does not authenticate: %q %v", tenant, err)
	}
	if _, _, err := cli2(t, "key", "create", "nobody", "--database-url", url); err == nil {
		t.Fatal("key for a missing tenant")
	}
}

func TestDemoSeedsOnlyAnEmptyDatabase(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	out, notes, err := cli2(t, "demo", "--database-url", url)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "tga_") || !strings.HasPrefix(lines[1], "tg_") {
		t.Fatalf("demo printed %q", out)
	}
	for _, secret := range lines {
		if strings.Count(notes+out, secret) != 1 {
			t.Fatalf("secret %q printed more than once", secret)
		}
	}
	if !strings.Contains(notes, "curl") || !strings.Contains(notes, "dashboard") {
		t.Fatalf("demo notes: %q", notes)
	}
	out, _, err = cli2(t, "demo", "--database-url", url)
	if err != nil || out != "" {
		t.Fatalf("second demo: %q %v", out, err)
	}
}

func TestTenantTreeAndShadowFromTheCLI(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	create := func(id string, extra ...string) error {
		_, _, err := cli2(t, append([]string{"tenant", "create", id, "--database-url", url, "--tokens-capacity", "1000", "--tokens-per-second", "1"}, extra...)...)
		return err
	}
	if err := create("org"); err != nil {
		t.Fatal(err)
	}
	if err := create("team", "--parent", "org", "--max-concurrent", "5", "--shadow", "concurrency"); err != nil {
		t.Fatal(err)
	}
	if err := create("key", "--parent", "team"); err != nil {
		t.Fatal(err)
	}
	if err := create("orphan", "--parent", "nobody"); err == nil || !strings.Contains(err.Error(), "parent") {
		t.Fatalf("an unknown parent: %v", err)
	}
	if err := create("x", "--shadow", "requests"); err == nil || !strings.Contains(err.Error(), "shadow") {
		t.Fatalf("shadow of an unconfigured limit: %v", err)
	}
	out, _, err := cli2(t, "tenant", "tree", "key", "--database-url", url)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[1], "org ") || !strings.HasPrefix(lines[2], "  team ") ||
		!strings.HasPrefix(lines[3], "    key ") || !strings.Contains(lines[2], "0/5") || !strings.HasSuffix(lines[2], "concurrency") {
		t.Fatalf("tree:\n%s", out)
	}
	if _, _, err := cli2(t, "tenant", "update", "team", "--database-url", url, "--shadow="); err != nil {
		t.Fatal(err)
	}
	pool := pgtest.Pool(t, url, nil)
	snap, err := account.NewStore(pool).TenantSnapshot(context.Background(), "team")
	if err != nil || snap.Limits.Shadow != 0 || snap.Parent() != "org" {
		t.Fatalf("after --shadow=: %+v %v", snap, err)
	}
	out, _, _ = cli2(t, "tenant", "list", "--database-url", url)
	if !strings.Contains(out, "PARENT") || !regexp.MustCompile(`(?m)^key\s+team\s+active\s`).MatchString(out) {
		t.Fatalf("list:\n%s", out)
	}
}

func TestModelLimitsFromTheCLI(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	if _, _, err := cli2(t, "tenant", "create", "acme", "--database-url", url, "--tokens-capacity", "1000", "--tokens-per-second", "1"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := cli2(t, "tenant", "model-limits", "set", "acme", "gpt-4o", "--database-url", url,
		"--input-capacity", "30000", "--input-per-second", "500", "--output-capacity", "8000", "--output-per-second", "133.333333",
		"--shadow", "output_tokens"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := cli2(t, "tenant", "model-limits", "set", "acme", "gpt-4o", "--database-url", url, "--shadow", "tokens",
		"--input-capacity", "1", "--input-per-second", "1"); err == nil || !strings.Contains(err.Error(), "shadow") {
		t.Fatalf("a tenant limit as a model's shadow: %v", err)
	}
	out, _, err := cli2(t, "tenant", "model-limits", "list", "acme", "--database-url", url)
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^gpt-4o\s+30000/30000\s+500\s+8000/8000\s+133\.333333\s+output_tokens$`).MatchString(out) {
		t.Fatalf("list:\n%s", out)
	}
	if _, _, err := cli2(t, "tenant", "model-limits", "remove", "acme", "gpt-4o", "--database-url", url); err != nil {
		t.Fatal(err)
	}
	if _, _, err := cli2(t, "tenant", "model-limits", "remove", "acme", "gpt-4o", "--database-url", url); err == nil {
		t.Fatal("removed twice")
	}
}

func TestPoolsFromTheCLI(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	for _, id := range []string{"acme", "beta"} {
		if _, _, err := cli2(t, "tenant", "create", id, "--database-url", url, "--tokens-capacity", "100000", "--tokens-per-second", "1"); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := cli2(t, "pool", "create", "gpu", "--database-url", url, "--tokens-capacity", "5000", "--tokens-per-second", "0.001",
		"--model", "gpt-4o", "--model", "meta-llama/Llama-3.1-8B"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := cli2(t, "pool", "weight", "gpu", "beta", "3", "--database-url", url); err != nil {
		t.Fatal(err)
	}
	if _, _, err := cli2(t, "pool", "weight", "gpu", "nobody", "3", "--database-url", url); err == nil {
		t.Fatal("weight for nobody")
	}
	if _, _, err := cli2(t, "pool", "route", "gpt-4o", "--database-url", url); err == nil {
		t.Fatal("route without a pool or --off")
	}
	pool := pgtest.Pool(t, url, nil)
	store := account.NewStore(pool)
	p := account.ReserveParams{TenantID: "acme", Estimate: estimator.Estimate{Model: "gpt-4o", Family: "gpt-4o", InputTokens: 300, OutputTokens: 700,
		Cost: 1000, InputWeightMicro: estimator.WeightOne, OutputWeightMicro: estimator.WeightOne}}
	if _, err := store.Reserve(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	out, _, err := cli2(t, "pool", "list", "--database-url", url)
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^gpu\s+4000/5000\s+0\.001\s+gpt-4o,meta-llama/Llama-3\.1-8B\s+acme\s+1\s+1000\s+100\.0%$`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^\s+beta\s+3\s+0\s+0\.0%$`).MatchString(out) {
		t.Fatalf("list:\n%s", out)
	}
	if _, _, err := cli2(t, "pool", "route", "gpt-4o", "--off", "--database-url", url); err != nil {
		t.Fatal(err)
	}
	if _, _, err := cli2(t, "pool", "update", "gpu", "--database-url", url, "--tokens-capacity", "100", "--tokens-per-second", "2"); err != nil {
		t.Fatal(err)
	}
	out, _, _ = cli2(t, "pool", "list", "--database-url", url)
	if !regexp.MustCompile(`(?m)^gpu\s+100/100\s+2\s+meta-llama/Llama-3\.1-8B\s`).MatchString(out) {
		t.Fatalf("after update and unroute:\n%s", out)
	}
	// A key's priority class.
	keyOut, _, err := cli2(t, "key", "create", "acme", "--database-url", url)
	if err != nil {
		t.Fatal(err)
	}
	id, _, _ := credential.Parse(credential.KeyPrefix, strings.TrimSpace(keyOut))
	if _, _, err := cli2(t, "key", "priority", "acme", id, "sheddable", "--database-url", url); err != nil {
		t.Fatal(err)
	}
	if _, _, err := cli2(t, "key", "priority", "acme", id, "urgent", "--database-url", url); err == nil {
		t.Fatal("an unknown class")
	}
	keys, err := credential.KeyList(context.Background(), pool, "acme")
	if err != nil || len(keys) != 1 || keys[0].Priority != "sheddable" {
		t.Fatalf("keys %+v %v", keys, err)
	}
}
