//go:build ha

package ha_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	dockercontainer "github.com/moby/moby/api/types/container"
	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/network"
	"github.com/testcontainers/testcontainers-go/wait"

	"github.com/tokengate/tokengate/budget"
	"github.com/tokengate/tokengate/budget/credential"
)

var ctx = context.Background()

func TestMain(m *testing.M) {
	if os.Getenv("TESTCONTAINERS_RYUK_DISABLED") == "" {
		_ = os.Setenv("TESTCONTAINERS_RYUK_DISABLED", "true")
	}
	if _, err := os.Stat("/.dockerenv"); err == nil && os.Getenv("TESTCONTAINERS_HOST_OVERRIDE") == "" {
		_ = os.Setenv("TESTCONTAINERS_HOST_OVERRIDE", "localhost")
	}
	os.Exit(m.Run())
}

func image(env, fallback string) string {
	if v := os.Getenv(env); v != "" {
		return v
	}
	return fallback
}

// The passwords the nodes are started with: the superuser's (the test's own
// connections) and the application role's (the replicas').
const superPassword, appPassword = "postgres", "tokengate"

// nodeNames are the Patroni members, also their names on the network.
var nodeNames = []string{"pg1", "pg2", "pg3"}

// cluster is etcd, three Patroni nodes and some tokengate replicas on their
// own network.
type cluster struct {
	t        *testing.T
	net      *testcontainers.DockerNetwork
	etcd     testcontainers.Container
	nodes    []*node
	replicas []*replica
}

// node is one Postgres under Patroni.
type node struct {
	name string
	ctr  testcontainers.Container
}

type replica struct {
	name string
	ctr  testcontainers.Container
	url  string
}

// newCluster starts etcd, the three nodes, waits for a leader and a
// synchronous standby, then starts n replicas (the first migrates). env adds
// to every replica's environment.
func newCluster(t *testing.T, n int, env map[string]string) *cluster {
	t.Helper()
	began := time.Now()
	nw, err := network.New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nw.Remove(ctx) })
	c := &cluster{t: t, net: nw}
	haImage := image("HA_IMAGE", "tc.local/patroni:15-bookworm")

	c.etcd = c.start("etcd", testcontainers.ContainerRequest{
		Image:      haImage,
		Cmd:        []string{"etcd"},
		Env:        map[string]string{"ETCD_ADVERTISE_HOST": "etcd"},
		WaitingFor: wait.ForLog("ready to serve client requests").WithStartupTimeout(60 * time.Second),
	})
	var wg sync.WaitGroup
	c.nodes = make([]*node, len(nodeNames))
	for i, name := range nodeNames {
		wg.Go(func() {
			ctr := c.start(name, testcontainers.ContainerRequest{
				Image: haImage,
				Cmd:   []string{"patroni"},
				Env: map[string]string{
					"HA_NAME": name, "HA_CONNECT_HOST": name, "HA_ETCD_HOSTS": "etcd:2379",
					"HA_SUPERUSER_PASSWORD": superPassword, "HA_REPLICATION_PASSWORD": "replicator",
					"HA_DB": "tokengate", "HA_DB_USER": "tokengate", "HA_DB_PASSWORD": appPassword,
				},
				ExposedPorts:       []string{"5432/tcp", "8008/tcp"},
				HostConfigModifier: func(hc *dockercontainer.HostConfig) { hc.ShmSize = 256 << 20 },
				// Patroni's REST API answers /liveness once its loop runs.
				WaitingFor: wait.ForHTTP("/liveness").WithPort("8008/tcp").WithStartupTimeout(60 * time.Second),
			})
			c.nodes[i] = &node{name: name, ctr: ctr}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	c.waitHealthy(90*time.Second, "")
	t.Logf("Patroni cluster up in %s (leader %s)", time.Since(began).Round(100*time.Millisecond), c.leader().name)

	hosts := make([]string, len(nodeNames))
	for i, name := range nodeNames {
		hosts[i] = name + ":5432"
	}
	for i := range n {
		name := fmt.Sprintf("replica-%d", i+1)
		renv := map[string]string{
			"TOKENGATE_DATABASE_URL": fmt.Sprintf("postgres://tokengate:%s@%s/tokengate?sslmode=disable&target_session_attrs=read-write&connect_timeout=2",
				appPassword, strings.Join(hosts, ",")),
			"TOKENGATE_READ_DATABASE_URL": fmt.Sprintf("postgres://tokengate:%s@%s/tokengate?sslmode=disable&target_session_attrs=prefer-standby&connect_timeout=2",
				appPassword, strings.Join(hosts, ",")),
			"TOKENGATE_REPLICA_ID": name,
			"TOKENGATE_REPLICAS":   strconv.Itoa(n),
			"TOKENGATE_LOG_LEVEL":  "warn",
			"TOKENGATE_DB_WAIT":    "60s",
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

// start runs one container on the cluster's network under alias; a failure
// is reported with the container's logs (t.Error, so that it may be called
// from several goroutines).
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

// hostPort is where this process reaches a container's port. A container
// started again gets new host ports, so it is read each time.
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

// member is one entry of Patroni's GET /cluster.
type member struct {
	Name     string `json:"name"`
	Role     string `json:"role"`  // leader, sync_standby or replica
	State    string `json:"state"` // running, streaming, starting, stopped, ...
	Host     string `json:"host"`
	Timeline int    `json:"timeline"`
	Lag      any    `json:"lag"` // bytes, or "unknown"
}

// restClient reads Patroni's state; switchClient waits for a switchover,
// which Patroni answers once it is done (up to about 30 s).
var restClient, switchClient = &http.Client{Timeout: 3 * time.Second}, &http.Client{Timeout: 60 * time.Second}

// members asks the nodes in turn for the cluster's state, as Patroni sees
// it in etcd; a node that is down is skipped.
func (c *cluster) members() ([]member, error) {
	var last error
	for _, n := range c.nodes {
		if !n.running() {
			continue
		}
		var v struct {
			Members []member `json:"members"`
		}
		if err := n.rest(http.MethodGet, "/cluster", nil, &v); err != nil {
			last = err
			continue
		}
		return v.Members, nil
	}
	return nil, fmt.Errorf("no node answered GET /cluster: %v", last)
}

// rest calls the node's Patroni REST API and decodes a JSON answer into out.
func (n *node) rest(method, path string, body any, out any) error {
	host, err := n.ctr.Host(ctx)
	if err != nil {
		return err
	}
	p, err := n.ctr.MappedPort(ctx, "8008/tcp")
	if err != nil {
		return err
	}
	var rd io.Reader
	if body != nil {
		raw, _ := json.Marshal(body)
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, "http://"+net.JoinHostPort(host, p.Port())+path, rd)
	if err != nil {
		return err
	}
	cl := restClient
	if method == http.MethodPost {
		cl = switchClient
	}
	resp, err := cl.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, bytes.TrimSpace(raw))
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			return fmt.Errorf("%s %s: %w: %s", method, path, err, raw)
		}
	}
	return nil
}

// running says whether the node's container runs (not killed or stopped).
func (n *node) running() bool {
	st, err := n.ctr.State(ctx)
	return err == nil && st.Running
}

// healthy: a leader that runs, a synchronous standby that streams, and every
// other member but those named in down a replica that streams.
func healthy(ms []member, want int, down string) bool {
	var leaders, syncs, count int
	for _, m := range ms {
		if m.Name == down {
			continue
		}
		count++
		switch {
		case m.Role == "leader" && m.State == "running":
			leaders++
		case m.Role == "sync_standby" && (m.State == "streaming" || m.State == "running"):
			syncs++
		case m.Role == "replica" && (m.State == "streaming" || m.State == "running"):
		default:
			return false
		}
	}
	return leaders == 1 && syncs == 1 && count == want
}

// waitHealthy waits until every node but down is a member in good health,
// with one leader and one synchronous standby.
func (c *cluster) waitHealthy(timeout time.Duration, down string) []member {
	c.t.Helper()
	want := len(c.nodes)
	if down != "" {
		want--
	}
	var ms []member
	var err error
	waitFor(c.t, "a leader and a synchronous standby", timeout, func() bool {
		ms, err = c.members()
		return err == nil && healthy(ms, want, down)
	}, func() string { return fmt.Sprintf("members %+v, err %v", ms, err) })
	return ms
}

// promoted waits until another node than old leads and runs, and returns
// when it was first seen (polled every 100 ms).
func (c *cluster) promoted(old *node, timeout time.Duration) (*node, time.Time) {
	c.t.Helper()
	var ms []member
	var err error
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		ms, err = c.members()
		for _, m := range ms {
			if err == nil && m.Role == "leader" && m.State == "running" && m.Name != old.name {
				return c.node(m.Name), time.Now()
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	c.t.Fatalf("no node but %s leads after %s: %+v %v", old.name, timeout, ms, err)
	return nil, time.Time{}
}

// leader is the node Patroni's /cluster names leader.
func (c *cluster) leader() *node {
	c.t.Helper()
	ms, err := c.members()
	if err != nil {
		c.t.Fatal(err)
	}
	return c.byRole(ms, "leader")
}

func (c *cluster) byRole(ms []member, role string) *node {
	c.t.Helper()
	for _, m := range ms {
		if m.Role == role {
			return c.node(m.Name)
		}
	}
	c.t.Fatalf("no %s among %+v", role, ms)
	return nil
}

func (c *cluster) node(name string) *node {
	for _, n := range c.nodes {
		if n.name == name {
			return n
		}
	}
	c.t.Fatalf("no node %s", name)
	return nil
}

// pool is a superuser connection to the node's tokengate database, through
// its host port as it is now.
func (c *cluster) pool(n *node) *pgxpool.Pool {
	c.t.Helper()
	dsn := fmt.Sprintf("postgres://postgres:%s@%s/tokengate?sslmode=disable&connect_timeout=5", superPassword, hostPort(c.t, n.ctr, "5432/tcp"))
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(pool.Close)
	return pool
}

// kill is `docker kill`: SIGKILL to Patroni and Postgres at once, no
// shutdown, the leader key left to expire.
func (c *cluster) kill(n *node) { docker(c.t, "kill", n.ctr.GetContainerID()) }

// restart starts a killed or stopped node again, with its data directory
// as it was.
func (c *cluster) restart(n *node) { docker(c.t, "start", n.ctr.GetContainerID()) }

// switchover asks the leader's REST API to hand over to candidate; Patroni
// answers once the candidate leads (or the switchover failed).
func (c *cluster) switchover(leader, candidate *node) {
	c.t.Helper()
	req := map[string]string{"leader": leader.name, "candidate": candidate.name}
	if err := leader.rest(http.MethodPost, "/switchover", req, nil); err != nil {
		c.t.Fatalf("switchover %s -> %s: %v", leader.name, candidate.name, err)
	}
}

// tenant creates a tenant on the leader and returns a key.
func (c *cluster) tenant(pool *pgxpool.Pool, id string, l budget.Limits) string {
	c.t.Helper()
	if _, err := budget.NewStore(pool).CreateTenant(ctx, budget.CreateTenantParams{ID: id, Limits: l}); err != nil {
		c.t.Fatal(err)
	}
	_, key, err := credential.KeyCreate(ctx, pool, id)
	if err != nil {
		c.t.Fatal(err)
	}
	return key
}

// metric reads one unlabelled gauge from the replica's /metrics.
func (r *replica) metric(name string) (float64, bool) {
	resp, err := restClient.Get(r.url + "/metrics")
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

func docker(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("docker", args...).CombinedOutput(); err != nil {
		t.Fatalf("docker %v: %v: %s", args, err, out)
	}
}

// waitFor polls ok until it holds or timeout passes; state, if set,
// describes what was last seen for the failure message.
func waitFor(t *testing.T, what string, timeout time.Duration, ok func() bool, state func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !ok() {
		if time.Now().After(deadline) {
			s := ""
			if state != nil {
				s = ": " + state()
			}
			t.Fatalf("timed out after %s waiting for %s%s", timeout, what, s)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
