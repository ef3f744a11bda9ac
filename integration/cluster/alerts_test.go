//go:build cluster

package cluster_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/tokengate/tokengate/budget/alert"
	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/budget/rule"
)

// TestAlertDeliveredAfterReplicaKilledMidDelivery: two replicas dispatch
// the outbox of one Postgres. A period budget's ten thresholds (up to 95 %:
// admissions of about 48 tokens cannot bring 1000 to exactly 100 %) are
// crossed through the API, so ten events wait. The first delivery to
// arrive is held by the receiver while the test kills the replica making
// it (docker kill: it records nothing). The other replica delivers that
// event once the lease runs out. Every event reaches the receiver, signed,
// at least once; each is recorded delivered exactly once; the killed
// replica's attempt is recorded abandoned.
func TestAlertDeliveredAfterReplicaKilledMidDelivery(t *testing.T) {
	const key = "cluster-test-alert-key-0123456789abcdef"
	// The receiver is on the docker network's gateway: a private address.
	c := newCluster(t, 2, map[string]string{"TOKENGATE_ALERT_KEY": key, "TOKENGATE_ALERT_ALLOW_HTTP": "true", "TOKENGATE_ALERT_ALLOW_PRIVATE": "true",
		"TOKENGATE_ALERT_INTERVAL": "200ms", "TOKENGATE_ALERT_TIMEOUT": "2s", "TOKENGATE_ALERT_LEASE": "4s", "TOKENGATE_ALERT_BACKOFF": "200ms"})

	// The receiver, in this process, reached through the network's gateway.
	ln, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var secret string
	seen := map[string]int{}
	held := make(chan string, 1)
	release := make(chan struct{})
	bad := 0
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		id := r.Header.Get(alert.HeaderEventID)
		mu.Lock()
		if alert.Verify(secret, r.Header.Get(alert.HeaderSignature), body, 5*time.Minute, time.Now()) != nil {
			bad++
		}
		seen[id]++
		first := len(seen) == 1 && seen[id] == 1
		mu.Unlock()
		if first {
			held <- id
			<-release
		}
		w.WriteHeader(http.StatusOK)
	})}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	hook := fmt.Sprintf("http://%s:%s/hook", c.gateway(), port)

	_, admin, err := credential.AdminTokenCreate(ctx, c.pool, "alerts")
	if err != nil {
		t.Fatal(err)
	}
	adminCall := func(path string, in any, out any) {
		t.Helper()
		body, _ := json.Marshal(in)
		req, _ := http.NewRequest(http.MethodPost, c.replicas[0].url+path, bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+admin)
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("%s: %d %s", path, resp.StatusCode, raw)
		}
		if err := json.Unmarshal(raw, out); err != nil {
			t.Fatal(err)
		}
	}
	var ep struct {
		Endpoint alert.Endpoint
		Secret   string
	}
	adminCall("/v1/admin/alerts/endpoints", map[string]string{"url": hook}, &ep)
	mu.Lock()
	secret = ep.Secret
	mu.Unlock()
	tenantKey := c.tenant("acme", rule.Limits{TokensCapacity: 1_000_000, TokensRateMicro: rule.Micro, PeriodBudget: 1000, Period: rule.PeriodDay})
	var rule alert.Rule
	adminCall("/v1/admin/alerts/rules", map[string]any{"tenant": "acme", "endpoint": ep.Endpoint.ID, "kind": "period_budget",
		"thresholds": []int{10, 20, 30, 40, 50, 60, 70, 80, 90, 95}}, &rule)

	// Spend the period budget through both replicas.
	for i := 0; ; i++ {
		a := admit(c.replicas[i%2].url, tenantKey, "", 40)
		if a.code == http.StatusTooManyRequests && a.limit == "period_budget" {
			break
		}
		if a.code != http.StatusCreated || i > 1000 {
			t.Fatalf("admission %d: %+v", i, a)
		}
	}

	var eventID string
	select {
	case eventID = <-held:
	case <-time.After(30 * time.Second):
		t.Fatal("no delivery reached the receiver")
	}
	var replicaName string
	if err := c.pool.QueryRow(ctx, `SELECT replica FROM alert_attempts WHERE event_id = $1 AND outcome = 'in_flight'`, eventID).Scan(&replicaName); err != nil {
		t.Fatal(err)
	}
	var victim, survivor *replica
	for _, r := range c.replicas {
		if r.name == replicaName {
			victim = r
		} else {
			survivor = r
		}
	}
	docker(t, "kill", victim.ctr.GetContainerID())
	close(release)

	waitFor(t, "every event recorded delivered", 60*time.Second, func() bool {
		var pending int
		if err := c.pool.QueryRow(ctx, `SELECT count(*) FROM alert_events WHERE state <> 'delivered'`).Scan(&pending); err != nil {
			t.Fatal(err)
		}
		return pending == 0
	})
	rows, err := c.pool.Query(ctx, `SELECT v.id, count(*) FILTER (WHERE a.outcome = 'delivered'),
		string_agg(a.replica || ':' || a.outcome, ',' ORDER BY a.attempt) FROM alert_events v JOIN alert_attempts a ON a.event_id = v.id GROUP BY v.id`)
	if err != nil {
		t.Fatal(err)
	}
	logs := map[string]string{}
	n := 0
	for rows.Next() {
		var id, log string
		var delivered int
		if err := rows.Scan(&id, &delivered, &log); err != nil {
			t.Fatal(err)
		}
		n++
		logs[id] = log
		if delivered != 1 {
			t.Errorf("event %s recorded delivered %d times: %s", id, delivered, log)
		}
		mu.Lock()
		if seen[id] < 1 {
			t.Errorf("event %s never reached the receiver", id)
		}
		mu.Unlock()
	}
	if n != 10 {
		t.Fatalf("%d events, want one per threshold (10)", n)
	}
	want := victim.name + ":abandoned," + survivor.name + ":delivered"
	if logs[eventID] != want {
		t.Fatalf("the held event's log: %s, want %s", logs[eventID], want)
	}
	mu.Lock()
	defer mu.Unlock()
	if bad != 0 || seen[eventID] != 2 {
		t.Fatalf("receiver: %d bad signatures; the held event arrived %d times (want 2)", bad, seen[eventID])
	}
	t.Logf("10 events delivered; the one held when %s was killed was delivered by %s: %s", victim.name, survivor.name, logs[eventID])
}
