//go:build ha

package ha_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/network"
	"github.com/testcontainers/testcontainers-go/wait"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/integration/await"
	"github.com/tokengate/tokengate/integration/patroni"
	"github.com/tokengate/tokengate/integration/pgtest"
)

var ctx = context.Background()

func TestMain(m *testing.M) {
	pgtest.DockerDefaults()
	os.Exit(m.Run())
}

func image(env, fallback string) string {
	if v := os.Getenv(env); v != "" {
		return v
	}
	return fallback
}

// cluster is a Patroni cluster (integration/patroni: etcd and three
// Postgres nodes) and some tokengate replicas on their own network.
type cluster struct {
	t        *testing.T
	ha       *patroni.Cluster
	net      *testcontainers.DockerNetwork
	replicas []*replica
}

type replica struct {
	name string
	ctr  testcontainers.Container
	url  string
}

// newCluster starts the Patroni cluster, waits for a leader and a
// synchronous standby, then starts n replicas (the first migrates) with the
// multi-host URL for decisions and a prefer-standby one for reads. env adds
// to every replica's environment.
func newCluster(t *testing.T, n int, env map[string]string) *cluster {
	t.Helper()
	began := time.Now()
	nw, err := network.New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nw.Remove(ctx) })
	ha, err := patroni.Start(ctx, nw.Name, 90*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ha.Terminate(context.Background()) })
	c := &cluster{t: t, ha: ha, net: nw}
	t.Logf("Patroni cluster up in %s (leader %s)", time.Since(began).Round(100*time.Millisecond), c.leader())

	for i := range n {
		name := fmt.Sprintf("replica-%d", i+1)
		renv := map[string]string{
			"TOKENGATE_DATABASE_URL":      ha.URL(),
			"TOKENGATE_READ_DATABASE_URL": ha.ReadURL(),
			"TOKENGATE_REPLICA_ID":        name,
			"TOKENGATE_REPLICAS":          strconv.Itoa(n),
			"TOKENGATE_LOG_LEVEL":         "warn",
			"TOKENGATE_DB_WAIT":           "60s",
		}
		for k, v := range env {
			renv[k] = v
		}
		cmd := []string{"serve"}
		if i == 0 {
			cmd = append(cmd, "--migrate")
		}
		ctr := c.start(name, testcontainers.ContainerRequest{
			Image:        image("TOKENGATE_IMAGE", "tc.local/tokengate:latest"),
			Env:          renv,
			Cmd:          cmd,
			ExposedPorts: []string{"8080/tcp"},
			WaitingFor:   wait.ForHTTP("/readyz").WithPort("8080/tcp").WithStartupTimeout(90 * time.Second),
		})
		if t.Failed() {
			t.FailNow()
		}
		r := &replica{name: name, ctr: ctr, url: "http://" + hostPort(t, ctr, "8080/tcp")}
		c.replicas = append(c.replicas, r)
	}
	t.Logf("cluster and %d replicas up in %s", n, time.Since(began).Round(100*time.Millisecond))
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		// What the replicas logged of the failure (they run at warn).
		for _, r := range c.replicas {
			lines := strings.Split(strings.TrimSpace(logs(r.ctr)), "\n")
			t.Logf("%s's last log lines:\n%s", r.name, strings.Join(lines[max(0, len(lines)-5):], "\n"))
		}
	})
	return c
}

// start runs one replica's container on the cluster's network under alias;
// a failure is reported with the container's logs.
func (c *cluster) start(alias string, req testcontainers.ContainerRequest) testcontainers.Container {
	c.t.Helper()
	req.Networks = []string{c.net.Name}
	req.NetworkAliases = map[string][]string{c.net.Name: {alias}}
	ctr, err := testcontainers.GenericContainer(ctx, testcontainers.GenericContainerRequest{ContainerRequest: req, Started: true})
	testcontainers.CleanupContainer(c.t, ctr)
	if err != nil {
		c.t.Errorf("start %s: %v\n%s", alias, err, logs(ctr))
	}
	return ctr
}

func logs(ctr testcontainers.Container) string {
	if ctr == nil {
		return ""
	}
	rc, err := ctr.Logs(ctx)
	if err != nil {
		return ""
	}
	defer rc.Close()
	raw, _ := io.ReadAll(rc)
	if len(raw) > 8000 {
		raw = raw[len(raw)-8000:]
	}
	return string(raw)
}

// hostPort is where this process reaches a replica's port.
func hostPort(t *testing.T, ctr testcontainers.Container, port string) string {
	t.Helper()
	host, err := ctr.Host(ctx)
	if err != nil {
		t.Fatal(err)
	}
	p, err := ctr.MappedPort(ctx, port)
	if err != nil {
		t.Fatalf("%s: %v", port, err)
	}
	return net.JoinHostPort(host, p.Port())
}

// waitHealthy waits until every node but those in down is up, with one
// leader and one synchronous standby, and returns the members.
func (c *cluster) waitHealthy(timeout time.Duration, down ...string) []patroni.Member {
	c.t.Helper()
	ms, err := c.ha.WaitHealthy(ctx, timeout, down...)
	if err != nil {
		c.t.Fatal(err)
	}
	return ms
}

// promoted waits until another node than old leads and runs, and returns
// it and when it was first seen (polled every 100 ms: the recovery time
// reports when Patroni promoted).
func (c *cluster) promoted(old string, timeout time.Duration) (string, time.Time) {
	c.t.Helper()
	var ms []patroni.Member
	var err error
	var leader string
	var at time.Time
	if await.For(timeout, 100*time.Millisecond, func() bool {
		ms, err = c.ha.Members(ctx)
		for _, m := range ms {
			if err == nil && m.Role == "leader" && m.State == "running" && m.Name != old {
				leader, at = m.Name, time.Now()
				return true
			}
		}
		return false
	}) {
		return leader, at
	}
	c.t.Fatalf("no node but %s leads after %s: %+v %v", old, timeout, ms, err)
	return "", time.Time{}
}

// leader is the node that leads now.
func (c *cluster) leader() string {
	c.t.Helper()
	name, err := c.ha.Primary(ctx)
	if err != nil {
		c.t.Fatal(err)
	}
	return name
}

func (c *cluster) byRole(ms []patroni.Member, role string) string {
	c.t.Helper()
	for _, m := range ms {
		if m.Role == role {
			return m.Name
		}
	}
	c.t.Fatalf("no %s among %+v", role, ms)
	return ""
}

// pool is a superuser connection to one node's tokengate database, through
// its host port as it is now; params are added to the URL.
func (c *cluster) pool(node string, params ...string) *pgxpool.Pool {
	c.t.Helper()
	url, err := c.ha.NodeURL(ctx, node, params...)
	if err != nil {
		c.t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(pool.Close)
	return pool
}

// tenant creates a tenant on the leader and returns a key.
func (c *cluster) tenant(pool *pgxpool.Pool, id string, l rule.Limits) string {
	c.t.Helper()
	if _, err := account.NewStore(pool).CreateTenant(ctx, account.CreateTenantParams{ID: id, Limits: l}); err != nil {
		c.t.Fatal(err)
	}
	_, key, err := credential.KeyCreate(ctx, pool, id)
	if err != nil {
		c.t.Fatal(err)
	}
	return key
}

var metricsClient = &http.Client{Timeout: 3 * time.Second}

// metric reads one unlabelled gauge from the replica's /metrics.
func (r *replica) metric(name string) (float64, bool) {
	resp, err := metricsClient.Get(r.url + "/metrics")
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return f, err == nil
		}
	}
	return 0, false
}

// readsOnStandby waits until every replica's reads pool
// (TOKENGATE_READ_DATABASE_URL, prefer-standby) measures its lag on a
// standby: tokengate_read_replica_standby and _up are 1.
func (c *cluster) readsOnStandby(timeout time.Duration) {
	c.t.Helper()
	for _, r := range c.replicas {
		var standby, up float64
		waitFor(c.t, r.name+"'s reads on a standby", timeout, func() bool {
			standby, _ = r.metric("tokengate_read_replica_standby")
			up, _ = r.metric("tokengate_read_replica_up")
			return standby == 1 && up == 1
		}, func() string { return fmt.Sprintf("standby %v, up %v", standby, up) })
	}
}

// ledgerVerify runs `tokengate ledger verify` inside a replica's container,
// through the replica's own multi-host URL: on whichever node is primary.
func (c *cluster) ledgerVerify(r *replica) string {
	c.t.Helper()
	out, err := exec.Command("docker", "exec", r.ctr.GetContainerID(), "/tokengate", "ledger", "verify").CombinedOutput()
	if err != nil {
		c.t.Fatalf("tokengate ledger verify: %v\n%s", err, out)
	}
	return string(out)
}

// waitFor polls ok until it holds or timeout passes; state, if set,
// describes what was last seen for the failure message.
func waitFor(t *testing.T, what string, timeout time.Duration, ok func() bool, state func() string) {
	t.Helper()
	await.UntilEvery(t, timeout, 200*time.Millisecond, what, ok, state)
}
