package main

import (
	"strings"
	"testing"

	"github.com/tokengate/tokengate/integration/pgtest"
)

// The batch allowance from the CLI: none at first, set with --capacity
// and --model, shown; a negative capacity is refused.
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
	out, _, err = cli2(t, "tenant", "batch-allowance", "acme", "--database-url", url, "--capacity", "700000", "--model", "gpt-4o,gpt-4o-mini")
	if err != nil || !strings.Contains(out, "batch allowance 700000 tokens, 0 enqueued, models [gpt-4o gpt-4o-mini]") {
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
