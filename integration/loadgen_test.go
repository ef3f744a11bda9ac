package integration_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/tokengate/tokengate/cmd/tokengate/loadgen"
)

// TestLoadgenAgreesWithTheLedger runs the load generator for two seconds
// against two replicas, through its default client (fasthttp) on the first
// and net/http on the second: what it counts as admitted and settled is
// exactly what the ledger holds, and the tenant's requests were throttled.
func TestLoadgenAgreesWithTheLedger(t *testing.T) {
	t.Parallel()
	c := startReplicas(t, 2, 8)
	// About 22 requests' worth of tokens, refilling 3 to 5 a second (each
	// costs about 90 and settles at less): the load is throttled even on a
	// machine so busy that it sends a few dozen requests a second. (At
	// 1000/s a CPU-starved run once stayed under the allowance.)
	key := c.tenant(t, "acme", 2000, "300")
	var reports []loadgen.Report
	for i, url := range c.urls {
		cfg := loadgen.Config{URL: url, Keys: []string{key}, Concurrency: 8, Duration: 2 * time.Second, MaxTokens: 60, Settle: true}
		if i == 1 {
			cfg.Client = &http.Client{Timeout: 30 * time.Second}
		}
		r, err := loadgen.Run(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		reports = append(reports, r)
	}
	var admitted, settled, rejected int
	for _, r := range reports {
		admitted, settled = admitted+r.Admitted, settled+r.Settled
		for _, n := range r.Rejected {
			rejected += n
		}
		if r.Errors != 0 || r.Requests != r.Admitted+sum(r.Rejected) {
			t.Fatalf("report: %s", r)
		}
	}
	f := facts(t, c.pool, "acme")
	verify(t, c.pool, "acme")
	if int(f.reserves) != admitted || int(f.settles) != settled || admitted == 0 || settled != admitted {
		t.Fatalf("loadgen: %d admitted, %d settled; ledger: %d reserves, %d settles", admitted, settled, f.reserves, f.settles)
	}
	if rejected == 0 {
		t.Fatal("the load never exceeded the tenant's allowance: the test proves nothing about throttling")
	}
	t.Logf("%s\n%s", reports[0], reports[1])
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
