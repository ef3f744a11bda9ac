//go:build cluster

package cluster_test

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
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	dockercontainer "github.com/moby/moby/api/types/container"
	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
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

// cluster is one Postgres (or a Patroni cluster) and some tokengate
// replicas on their own network.
type cluster struct {
	t   *testing.T
	net *testcontainers.DockerNetwork
	pg  *tcpostgres.PostgresContainer // nil when the store is ha
	// ha, when set, is the store instead of pg: three Postgres nodes
	// under Patroni (integration/patroni).
	ha *patroni.Cluster
	// dbURL is the store as the replicas reach it on the network.
	dbURL    string
	pool     *pgxpool.Pool // the test's own connection, through the mapped port
	store    *account.Store
	replicas []*replica
	env      map[string]string
	// replicaEnv, when set, adds to one replica's environment (after env).
	replicaEnv func(name string) map[string]string
}

type replica struct {
	name string
	ctr  testcontainers.Container
	url  string
	// proxyURL and rlsAddr are the replica's OpenAI proxy and rate limit
	// service as this process reaches them, when it serves them.
	proxyURL, rlsAddr string
	ports             []string // the container ports it exposes
}

// The container ports of a replica's faces: the HTTP API and, when the
// replica serves them, the rate limit service (TOKENGATE_RLS_ADDR=:8081)
// and the OpenAI proxy (TOKENGATE_PROXY_ADDR=:8082).
const apiPort, rlsPort, proxyPort = "8080/tcp", "8081/tcp", "8082/tcp"

// locate reads the host ports of the replica's faces: a container started
// again may have new ones.
func (r *replica) locate() error {
	host, err := r.ctr.Host(ctx)
	if err != nil {
		return err
	}
	for _, port := range r.ports {
		p, err := r.ctr.MappedPort(ctx, port)
		if err != nil {
			return err
		}
		addr := net.JoinHostPort(host, p.Port())
		switch port {
		case apiPort:
			r.url = "http://" + addr
		case rlsPort:
			r.rlsAddr = addr
		case proxyPort:
			r.proxyURL = "http://" + addr
		}
	}
	return nil
}

// newCluster starts Postgres and n replicas. env adds to every replica's
// environment.
func newCluster(t *testing.T, n int, env map[string]string) *cluster {
	t.Helper()
	return startCluster(t, n, env, nil)
}

// startCluster is newCluster with a hook that may add to each replica's
// environment once Postgres runs (a replica's own route to it, say).
func startCluster(t *testing.T, n int, env map[string]string, replicaEnv func(c *cluster, name string) map[string]string) *cluster {
	t.Helper()
	return startClusterOn(t, false, n, env, replicaEnv)
}

// startClusterOn is startCluster on a Patroni cluster (three Postgres
// nodes, etcd) when ha is set, else on one Postgres.
func startClusterOn(t *testing.T, ha bool, n int, env map[string]string, replicaEnv func(c *cluster, name string) map[string]string) *cluster {
	t.Helper()
	nw, err := network.New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nw.Remove(ctx) })
	if ha {
		began := time.Now()
		hc, err := patroni.Start(ctx, nw.Name, 120*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = hc.Terminate(ctx) })
		primary, _ := hc.Primary(ctx)
		t.Logf("patroni: etcd and %v up in %s, %s leads", hc.Nodes(), time.Since(began).Round(100*time.Millisecond), primary)
		c := &cluster{t: t, net: nw, ha: hc, dbURL: hc.URL(), env: env, pool: hc.Pool(), store: account.NewStore(hc.Pool())}
		if replicaEnv != nil {
			c.replicaEnv = func(name string) map[string]string { return replicaEnv(c, name) }
		}
		for i := range n {
			c.addReplica(fmt.Sprintf("replica-%d", i+1), i == 0)
		}
		return c
	}
	pg, err := tcpostgres.Run(ctx, image("PG_IMAGE", "tc.local/postgres:15-bookworm"),
		tcpostgres.WithDatabase("tokengate"), tcpostgres.WithUsername("postgres"), tcpostgres.WithPassword("postgres"),
		tcpostgres.BasicWaitStrategies(),
		network.WithNetwork([]string{"pg"}, nw),
		testcontainers.WithHostConfigModifier(func(hc *dockercontainer.HostConfig) { hc.ShmSize = 256 << 20 }),
	)
	testcontainers.CleanupContainer(t, pg)
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{t: t, net: nw, pg: pg, env: env, dbURL: "postgres://postgres:postgres@pg:5432/tokengate?sslmode=disable&connect_timeout=2"}
	if replicaEnv != nil {
		c.replicaEnv = func(name string) map[string]string { return replicaEnv(c, name) }
	}
	for i := range n {
		c.addReplica(fmt.Sprintf("replica-%d", i+1), i == 0)
	}
	dsn, err := pg.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	c.pool, err = pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.pool.Close)
	c.store = account.NewStore(c.pool)
	return c
}

func (c *cluster) addReplica(name string, migrate bool) *replica {
	c.t.Helper()
	env := map[string]string{
		"TOKENGATE_DATABASE_URL": c.dbURL,
		"TOKENGATE_REPLICA_ID":   name,
		"TOKENGATE_LOG_LEVEL":    "warn",
		"TOKENGATE_DB_WAIT":      "60s",
	}
	for k, v := range c.env {
		env[k] = v
	}
	if c.replicaEnv != nil {
		for k, v := range c.replicaEnv(name) {
			env[k] = v
		}
	}
	cmd := []string{"serve"}
	if migrate {
		cmd = append(cmd, "--migrate")
	}
	exposed := []string{apiPort}
	if env["TOKENGATE_RLS_ADDR"] != "" {
		exposed = append(exposed, rlsPort)
	}
	if env["TOKENGATE_PROXY_ADDR"] != "" {
		exposed = append(exposed, proxyPort)
	}
	ctr, err := testcontainers.GenericContainer(ctx, testcontainers.GenericContainerRequest{
		ContainerRequest: testcontainers.ContainerRequest{
			Image:        image("TOKENGATE_IMAGE", "tc.local/tokengate:latest"),
			Name:         "",
			Env:          env,
			Cmd:          cmd,
			ExposedPorts: exposed,
			Networks:     []string{c.net.Name},
			WaitingFor:   wait.ForHTTP("/readyz").WithPort("8080/tcp").WithStartupTimeout(90 * time.Second),
		},
		Started: true,
	})
	testcontainers.CleanupContainer(c.t, ctr)
	if err != nil {
		logs := ""
		if ctr != nil {
			if rc, lerr := ctr.Logs(ctx); lerr == nil {
				raw, _ := io.ReadAll(rc)
				logs = string(raw)
			}
		}
		c.t.Fatalf("start %s: %v\n%s", name, err, logs)
	}
	r := &replica{name: name, ctr: ctr, ports: exposed}
	if err := r.locate(); err != nil {
		c.t.Fatal(err)
	}
	c.replicas = append(c.replicas, r)
	return r
}

// tenant creates a tenant in the shared database and returns a key.
func (c *cluster) tenant(id string, l rule.Limits) string {
	c.t.Helper()
	if _, err := c.store.CreateTenant(ctx, account.CreateTenantParams{ID: id, Limits: l}); err != nil {
		c.t.Fatal(err)
	}
	_, key, err := credential.KeyCreate(ctx, c.pool, id)
	if err != nil {
		c.t.Fatal(err)
	}
	return key
}

// gateway is the address at which the replicas reach this process (a
// proxy or a receiver the test runs): their network's gateway.
func (c *cluster) gateway() string {
	c.t.Helper()
	out, err := exec.Command("docker", "network", "inspect", "-f", "{{(index .IPAM.Config 0).Gateway}}", c.net.Name).CombinedOutput()
	if err != nil {
		c.t.Fatalf("the network's gateway: %v: %s", err, out)
	}
	return strings.TrimSpace(string(out))
}

func docker(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("docker", args...).CombinedOutput(); err != nil {
		t.Fatalf("docker %v: %v: %s", args, err, out)
	}
}

var client = &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}

type answer struct {
	code    int
	id      string
	limit   string
	typ     string
	local   bool
	cost    int64
	replica string
}

func admit(url, key, idemKey string, maxTokens int) answer {
	body := fmt.Sprintf(`{"model":"gpt-4o-mini","prompt":"hello","max_tokens":%d}`, maxTokens)
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/admissions", bytes.NewBufferString(body))
	req.Header.Set("Authorization", "Bearer "+key)
	if idemKey != "" {
		req.Header.Set("Idempotency-Key", idemKey)
	}
	resp, err := client.Do(req)
	if err != nil {
		return answer{code: 0, typ: err.Error()}
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var v struct {
		ID       string `json:"id"`
		Estimate struct {
			Cost int64 `json:"cost"`
		} `json:"estimate"`
		Error struct {
			Type  string `json:"type"`
			Limit string `json:"limit"`
		} `json:"error"`
	}
	_ = json.Unmarshal(raw, &v)
	return answer{code: resp.StatusCode, id: v.ID, limit: v.Error.Limit, typ: v.Error.Type,
		local: resp.Header.Get("X-Tokengate-Decided-By") == "local", cost: v.Estimate.Cost}
}

// ledgerReserves counts reserve entries per admission id.
func (c *cluster) ledgerReserves(tenant string) map[string]int {
	c.t.Helper()
	rows, err := c.pool.Query(ctx, `SELECT admission_id FROM ledger_entries WHERE tenant_id = $1 AND kind = 'reserve'`, tenant)
	if err != nil {
		c.t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			c.t.Fatal(err)
		}
		out[id]++
	}
	return out
}

func (c *cluster) audit() {
	c.t.Helper()
	res, err := c.store.Audit(ctx, "")
	if err != nil {
		c.t.Fatal(err)
	}
	for _, r := range res {
		if !r.OK {
			c.t.Fatalf("ledger audit: %+v", r)
		}
	}
}

// load runs workers against the replicas, round-robin, until stop closes,
// and returns every answer.
func load(replicas []*replica, key string, workers int, maxTokens int, stop <-chan struct{}) []answer {
	return startLoad(replicas, key, workers, maxTokens, stop).wait()
}

// loadRun is a load under way: a test reads its answers so far to wait for
// what the load has reached (every replica admitting, say) instead of
// guessing how long that takes.
type loadRun struct {
	mu  sync.Mutex
	out []answer
	wg  sync.WaitGroup
}

// answers copies the answers so far.
func (l *loadRun) answers() []answer {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]answer(nil), l.out...)
}

// wait waits for the workers to stop (stop closed) and returns every
// answer.
func (l *loadRun) wait() []answer {
	l.wg.Wait()
	return l.out
}

// startLoad starts workers against the replicas, round-robin, until stop
// closes.
func startLoad(replicas []*replica, key string, workers int, maxTokens int, stop <-chan struct{}) *loadRun {
	l := &loadRun{}
	mu, wg := &l.mu, &l.wg
	for w := range workers {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				r := replicas[(w+i)%len(replicas)]
				a := admit(r.url, key, "", maxTokens)
				a.replica = r.name
				mu.Lock()
				l.out = append(l.out, a)
				mu.Unlock()
				if a.code != http.StatusCreated {
					clientPause(5 * time.Millisecond) // a client's small backoff
				}
			}
		})
	}
	return l
}

// clientPause is a client's pause: before it retries, or while it holds an
// admission open. Its length is the load's shape, as a real client's.
func clientPause(d time.Duration) {
	time.Sleep(d) // real time: the pace of a client is what the load is made of
}

func waitFor(t *testing.T, what string, timeout time.Duration, ok func() bool) {
	t.Helper()
	await.UntilEvery(t, timeout, 100*time.Millisecond, what, ok, nil)
}
