package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tokengate/tokengate/estimator"
	"github.com/tokengate/tokengate/integration/pgtest"
)

// TestPricesCommands: import applies the embedded table once (a second
// import adds nothing), --file adds only the changed price, list prints
// the table in effect now and at a past time, add appends a future price
// and refuses a past one.
func TestPricesCommands(t *testing.T) {
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
	f, err := estimator.DefaultPriceFile()
	if err != nil {
		t.Fatal(err)
	}
	ps, _ := f.Prices()
	count := func() int {
		t.Helper()
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM model_prices`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	out, notes := must("prices", "import", "--actor", "alice")
	if strings.Count(out, "added ") != len(ps) || !strings.Contains(notes, f.Version) || count() != len(ps) {
		t.Fatalf("first import: %q %q, %d rows", out, notes, count())
	}
	firstImport := time.Now()
	out, notes = must("prices", "import")
	if out != "" || !strings.Contains(notes, "0 added") || count() != len(ps) {
		t.Fatalf("second import: %q %q, %d rows", out, notes, count())
	}

	file := filepath.Join(t.TempDir(), "prices.json")
	if err := os.WriteFile(file, []byte(`{"version":"test-2","providers":[{"provider":"openai","source":"https://example.test","taken":"2026-12-05",
		"models":[{"model":"gpt-4o","input":"2","cached_input":"1.25","output":"10"},{"model":"gpt-4o-mini","input":"0.15","cached_input":"0.075","output":"0.60"}]}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	out, notes = must("prices", "import", "--file", file)
	if out != "added gpt-4o\n" || !strings.Contains(notes, "1 added, 1 unchanged") || count() != len(ps)+1 {
		t.Fatalf("import --file: %q %q", out, notes)
	}

	out, _ = must("prices", "list", "--model", "gpt-4o", "--service-tier", "default") // the file prices its batch and priority tiers too
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "MODEL") || strings.Fields(lines[1])[1] != "default" || strings.Fields(lines[1])[3] != "2" || strings.Fields(lines[1])[5] != "1.25" {
		t.Fatalf("list --model gpt-4o: %q", out)
	}
	out, _ = must("prices", "list", "--model", "gpt-4o", "--service-tier", "default", "--at", firstImport.UTC().Format(time.RFC3339Nano))
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 2 || strings.Fields(lines[1])[3] != "2.5" {
		t.Fatalf("list --at the first import: %q", out)
	}
	out, _ = must("prices", "list")
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != len(ps)+1 || !strings.Contains(out, "claude-sonnet-4-5") ||
		!strings.Contains(out, ">200000: 2.5/15") {
		t.Fatalf("list: %q", out)
	}

	later := time.Now().Add(48 * time.Hour).UTC().Truncate(time.Second)
	must("prices", "add", "acme-llm", "--input", "0.5", "--output", "1.5", "--reasoning-output", "3", "--effective-from", later.Format(time.RFC3339), "--actor", "bob")
	p, err := estimator.PriceAt(ctx, pool, "acme-llm", later)
	if err != nil || p.InputMicro != 500_000 || *p.ReasoningOutputMicro != 3_000_000 || p.CreatedBy != "bob" || p.Source != "cli" {
		t.Fatalf("added price: %+v %v", p, err)
	}
	if out, _ := must("prices", "list", "--model", "acme-llm"); strings.Contains(out, "acme-llm") {
		t.Fatalf("a future price listed as in effect: %q", out)
	}
	_, _, err = cli2(t, "prices", "add", "acme-llm", "--input", "1", "--output", "1", "--effective-from", "2020-01-01T00:00:00Z", "--database-url", url)
	if err == nil || !strings.Contains(err.Error(), "effective_from") {
		t.Fatalf("a past price: %v", err)
	}
	_, _, err = cli2(t, "prices", "add", "acme-llm", "--input", "x", "--output", "1", "--database-url", url)
	if err == nil || !strings.Contains(err.Error(), "--input") {
		t.Fatalf("a bad price: %v", err)
	}
	if count() != len(ps)+2 {
		t.Fatalf("%d rows after refused adds", count())
	}

	// A price per service tier: added with --service-tier, listed by it;
	// an unknown tier is refused, naming it.
	must("prices", "add", "gpt-4o", "--service-tier", "flex", "--input", "1.25", "--output", "5")
	out, _ = must("prices", "list", "--model", "gpt-4o", "--service-tier", "flex")
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 2 || strings.Fields(lines[1])[1] != "flex" || strings.Fields(lines[1])[3] != "1.25" {
		t.Fatalf("list with a flex price: %q", out)
	}
	out, _ = must("prices", "list", "--service-tier", "flex")
	// gpt-4o's, and the seeded o4-mini's.
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 3 || strings.Fields(lines[1])[0] != "gpt-4o" || strings.Fields(lines[2])[0] != "o4-mini" {
		t.Fatalf("list --service-tier flex: %q", out)
	}
	for _, args := range [][]string{
		{"prices", "add", "gpt-4o", "--service-tier", "scale", "--input", "1", "--output", "1"},
		{"prices", "list", "--service-tier", "scale"},
	} {
		if _, _, err := cli2(t, append(args, "--database-url", url)...); err == nil || !strings.Contains(err.Error(), "service_tier") {
			t.Fatalf("%v: %v", args, err)
		}
	}
	if count() != len(ps)+3 {
		t.Fatalf("%d rows after a refused tier", count())
	}
}
