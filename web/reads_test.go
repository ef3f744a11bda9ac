package web_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/replica"
	"github.com/tokengate/tokengate/integration/pgtest"
	"github.com/tokengate/tokengate/web"
)

// TestOverviewShowsWhereReadsGo: with a reads pool, the overview says
// where the ledger pages read and how far behind that is, and the ledger
// page reads from it; without one, it says nothing.
func TestOverviewShowsWhereReadsGo(t *testing.T) {
	t.Parallel()
	reads := pgtest.New(t, nil) // stands for a standby that replayed nothing yet
	b := setup(t, func(rc *replica.Config, _ *web.Config) { rc.Reads = reads })
	key := b.tenant(t, "acme", limits(100_000, "1"))
	if rec := b.admit(t, key, 100); rec.Code != http.StatusCreated {
		t.Fatalf("admit: %d %s", rec.Code, rec.Body)
	}
	c := b.client(t, "192.0.2.60")
	c.mustLogin()
	if body := c.get("/").Body.String(); !strings.Contains(body, `id="read-replica"`) || !strings.Contains(body, "its lag is not measured yet") {
		t.Fatal("the overview does not say that the lag is not measured yet")
	}
	if err := b.rep.Lag.Check(ctx); err != nil {
		t.Fatal(err)
	}
	body := c.get("/").Body.String()
	if !strings.Contains(body, `data-lag-seconds="0.000"`) || !strings.Contains(body, "read from the primary: no standby answered the read URL") {
		t.Fatalf("the overview's read note: %s", between(body, `id="read-replica"`, "</p>"))
	}
	// The ledger page reads from the reads pool, where acme has no entries.
	if _, err := account.NewStore(reads).CreateTenant(ctx, account.CreateTenantParams{ID: "other", Limits: limits(1000, "1")}); err != nil {
		t.Fatal(err)
	}
	page := c.get("/ledger").Body.String()
	if !strings.Contains(page, ">other<") || strings.Contains(page, ">acme<") {
		t.Fatal("the ledger page did not read from the reads pool")
	}

	plain := setup(t, nil)
	pc := plain.client(t, "192.0.2.61")
	pc.mustLogin()
	if strings.Contains(pc.get("/").Body.String(), `id="read-replica"`) {
		t.Fatal("a note about a read replica that is not configured")
	}
}

func between(s, from, to string) string {
	i := strings.Index(s, from)
	if i < 0 {
		return ""
	}
	s = s[i:]
	if j := strings.Index(s, to); j >= 0 {
		return s[:j]
	}
	return s
}

// TestDashboardWithTheReadsPoolDown: with the reads pool's server down,
// the overview, the tenant, ledger and drift pages and the ledger's CSV
// answer from the primary (they answered 500), and the overview says so.
func TestDashboardWithTheReadsPoolDown(t *testing.T) {
	t.Parallel()
	reads := pgtest.New(t, nil)
	b := setup(t, func(rc *replica.Config, _ *web.Config) { rc.Reads = reads })
	key := b.tenant(t, "acme", limits(100_000, "1"))
	if rec := b.admit(t, key, 100); rec.Code != http.StatusCreated {
		t.Fatalf("admit: %d %s", rec.Code, rec.Body)
	}
	c := b.client(t, "192.0.2.62")
	c.mustLogin()
	// As a stopped server is to its clients: sessions ended, connections refused.
	db := pgx.Identifier{reads.Config().ConnConfig.Database}.Sanitize()
	admin := pgtest.Admin(t)
	if _, err := admin.Exec(ctx, "ALTER DATABASE "+db+" ALLOW_CONNECTIONS false"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = admin.Exec(ctx, "ALTER DATABASE "+db+" ALLOW_CONNECTIONS true") })
	if _, err := admin.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1",
		reads.Config().ConnConfig.Database); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/ledger", "/", "/tenants/acme", "/models", "/ledger.csv"} {
		rec := c.get(path)
		if rec.Code != http.StatusOK {
			t.Fatalf("%s with the reads pool down: %d %s", path, rec.Code, rec.Body)
		}
		if path == "/ledger.csv" && strings.Count(rec.Body.String(), "\nacme,") != 2 {
			t.Fatalf("the CSV with the reads pool down: %s", rec.Body)
		}
	}
	if body := c.get("/").Body.String(); !strings.Contains(body, "read from the primary while the replica is unreachable") {
		t.Fatalf("the overview's read note: %s", between(body, `id="read-replica"`, "</p>"))
	}
}
