//go:build cluster

package cluster_test

import (
	"net/http"
	"sort"
	"testing"
	"time"

	"github.com/tokengate/tokengate/budget/rule"
)

// TestAggregateAdmissionAcrossFourReplicas: four replicas, one tenant with
// capacity C and refill R, clients spread over all of them for T seconds.
// The replicas together admit no more than C + R x T (T from database
// times), and, since demand exceeds it, no less than 95 % of it.
func TestAggregateAdmissionAcrossFourReplicas(t *testing.T) {
	c := newCluster(t, 4, nil)
	const capacity, rate = 2000, 500
	key := c.tenant("acme", rule.Limits{TokensCapacity: capacity, TokensRateMicro: rate * rule.Micro})
	stop := make(chan struct{})
	time.AfterFunc(8*time.Second, func() { close(stop) })
	answers := load(c.replicas, key, 32, 50, stop)

	perReplica := map[string]int64{}
	var admitted, rejected int64
	for _, a := range answers {
		switch a.code {
		case http.StatusCreated:
			perReplica[a.replica] += a.cost
			admitted += a.cost
		case http.StatusTooManyRequests:
			rejected++
		default:
			t.Fatalf("unexpected answer %+v", a)
		}
	}
	// T runs from the first admission, when the bucket was full at C (it
	// cannot hold more), to the last one, by the database's clock.
	var created, last time.Time
	var ledgerCost int64
	err := c.pool.QueryRow(ctx, `SELECT min(created_at), max(created_at), sum(estimate)
		FROM ledger_entries WHERE tenant_id = 'acme' AND kind = 'reserve'`).Scan(&created, &last, &ledgerCost)
	if err != nil {
		t.Fatal(err)
	}
	elapsed := last.Sub(created).Microseconds()
	bound := capacity*rule.Micro + rate*elapsed // micro-tokens
	if ledgerCost != admitted {
		t.Fatalf("clients saw %d admitted, the ledger %d", admitted, ledgerCost)
	}
	if admitted*rule.Micro > bound {
		t.Fatalf("admitted %d tokens > C + R x T = %.1f", admitted, float64(bound)/rule.Micro)
	}
	if float64(admitted*rule.Micro) < 0.95*float64(bound) {
		t.Fatalf("admitted %d tokens < 95%% of C + R x T = %.1f: quota wasted", admitted, float64(bound)/rule.Micro)
	}
	if rejected == 0 {
		t.Fatal("demand never exceeded the allowance")
	}
	names := make([]string, 0, len(perReplica))
	for n := range perReplica {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		t.Logf("%s admitted %d tokens (%.1f%%)", n, perReplica[n], 100*float64(perReplica[n])/float64(admitted))
	}
	if len(perReplica) != 4 {
		t.Fatalf("only %d replicas admitted anything", len(perReplica))
	}
	t.Logf("admitted %d of a bound of %.1f tokens (%.2f%%) over %s; %d rejections",
		admitted, float64(bound)/rule.Micro, 100*float64(admitted*rule.Micro)/float64(bound), last.Sub(created), rejected)
	c.audit()
}
