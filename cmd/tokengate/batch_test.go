package main

import (
	"strings"
	"testing"

	"github.com/tokengate/tokengate/integration/pgtest"
)

// The batch allowance from the CLI: none at first, set with --capacity
// shown; a negative capacity is refused. (The models a line may name are
// the tenant's and keys' model scopes: scope_test.go.)
func TestBatchAllowanceFromTheCLI(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	if _, _, err := cli2(t, "tenant", "create", "acme", "--database-url", url, "--tokens-capacity", "5000", "--tokens-per-second", "1"); err != nil {
		t.Fatal(err)
	}
	out, _, err := cli2(t, "tenant", "batch-allowance", "acme", "--database-url", url)
	if err != nil || !strings.Contains(out, "no batch allowance") {
		t.Fatalf("before: %q %v", out, err)
	}
	out, _, err = cli2(t, "tenant", "batch-allowance", "acme", "--database-url", url, "--capacity", "700000")
	if err != nil || !strings.Contains(out, "batch allowance 700000 tokens, 0 enqueued") {
		t.Fatalf("set: %q %v", out, err)
	}
	if _, _, err := cli2(t, "tenant", "batch-allowance", "acme", "--database-url", url, "--capacity", "-1"); err == nil {
		t.Fatal("a negative capacity was accepted")
	}
	out, _, err = cli2(t, "tenant", "batch-allowance", "acme", "--database-url", url)
	if err != nil || !strings.Contains(out, "700000 tokens") {
		t.Fatalf("shown: %q %v", out, err)
	}
}
