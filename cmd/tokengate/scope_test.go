package main

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/integration/pgtest"
)

// Model scopes from the CLI: a tenant's with tenant update --models (alone
// or beside a limit), a key's with key create --models and key models
// --set; each stored as given, shown, and a bad list refused.
func TestModelScopesFromTheCLI(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	if _, _, err := cli2(t, "tenant", "create", "acme", "--database-url", url, "--tokens-capacity", "5000", "--tokens-per-second", "1"); err != nil {
		t.Fatal(err)
	}
	if _, notes, err := cli2(t, "tenant", "update", "acme", "--database-url", url, "--models", "gpt-4o*, claude-*"); err != nil || !strings.Contains(notes, "may use: gpt-4o*,claude-*") {
		t.Fatalf("tenant update --models: %q %v", notes, err)
	}
	if _, _, err := cli2(t, "tenant", "update", "acme", "--database-url", url, "--models", "gpt-4o", "--tokens-capacity", "6000"); err != nil {
		t.Fatalf("--models with a limit: %v", err)
	}
	if _, _, err := cli2(t, "tenant", "update", "acme", "--database-url", url, "--models", "gpt 4o"); err == nil || !strings.Contains(err.Error(), "models") {
		t.Fatalf("a bad list: %v", err)
	}
	pool := pgtest.Pool(t, url, nil)
	snap, err := account.NewStore(pool).TenantSnapshot(context.Background(), "acme")
	if err != nil || !slices.Equal(snap.Models, []string{"gpt-4o"}) || snap.Limits.TokensCapacity != 6000 {
		t.Fatalf("the tenant: %q, %d tokens, %v", snap.Models, snap.Limits.TokensCapacity, err)
	}

	out, _, err := cli2(t, "key", "create", "acme", "--database-url", url, "--models", "gpt-4o")
	if err != nil {
		t.Fatal(err)
	}
	id, _, ok := credential.Parse(credential.KeyPrefix, strings.TrimSpace(out))
	if !ok {
		t.Fatalf("key create printed %q", out)
	}
	if out, _, err := cli2(t, "key", "models", "acme", id, "--database-url", url); err != nil || strings.TrimSpace(out) != "gpt-4o" {
		t.Fatalf("key models: %q %v", out, err)
	}
	if _, _, err := cli2(t, "key", "models", "acme", id, "--database-url", url, "--set", ""); err != nil {
		t.Fatal(err)
	}
	if out, _, err := cli2(t, "key", "models", "acme", id, "--database-url", url); err != nil || strings.TrimSpace(out) != "every model" {
		t.Fatalf("key models after --set=: %q %v", out, err)
	}
	if _, _, err := cli2(t, "key", "models", "acme", "nokey", "--database-url", url, "--set", "gpt-4o"); err == nil {
		t.Fatal("--set on no key succeeded")
	}
}
