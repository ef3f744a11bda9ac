// Package patroni starts a highly available Postgres for tests: one etcd
// and three Postgres 15 nodes under Patroni 3.0 in synchronous mode, each a
// container from the tc.local/patroni image (`make ha-image`,
// integration/haimage), on a Docker network the caller owns. It waits for a
// leader and a synchronous standby, and then offers what a failover test
// needs: the multi-host URL that tokengate replicas on the network use, a
// pool for the test process that always reaches the node that takes writes
// (across failovers and host ports that move), the current primary, and
// the faults: a node killed (`docker kill`) and started again, and a
// planned switchover.
//
// It is for tests only, like integration/pgtest; it imports nothing of the
// module.
package patroni

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	dockercontainer "github.com/moby/moby/api/types/container"
	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"
)

// DefaultImage is the locally built image (integration/haimage); HA_IMAGE
// overrides it.
const DefaultImage = "tc.local/patroni:15-bookworm"

// The roles and the database the nodes are started with (the image's
// HA_* environment). The application role owns the database: tokengate
// replicas connect as it and migrate it. The test process connects as the
// superuser.
const (
	Database      = "tokengate"
	AppUser       = "tokengate"
	AppPassword   = "tokengate"
	SuperUser     = "postgres"
	SuperPassword = "postgres"
)

// Member is one node as Patroni's GET /cluster describes it.
type Member struct {
	Name     string `json:"name"`
	Role     string `json:"role"`  // leader, sync_standby or replica
	State    string `json:"state"` // running, streaming, starting, stopped, ...
	Timeline int    `json:"timeline"`
	Lag      any    `json:"lag"` // bytes behind the leader, or "unknown"
}

func (m Member) up() bool { return m.State == "running" || m.State == "streaming" }

// Cluster is a running Patroni cluster.
type Cluster struct {
	network string
	etcd    testcontainers.Container
	names   []string // the nodes' names, also their host names on the network
	nodes   map[string]testcontainers.Container
	pool    *pgxpool.Pool
}

// Start starts etcd and three nodes named pg1, pg2 and pg3 (also their
// host names) on the Docker network named network, and waits up to
// timeout for a leader, a synchronous standby and a streaming replica.
// On an error it terminates what it started.
func Start(ctx context.Context, network string, timeout time.Duration) (_ *Cluster, err error) {
	img := os.Getenv("HA_IMAGE")
	if img == "" {
		img = DefaultImage
	}
	c := &Cluster{network: network, names: []string{"pg1", "pg2", "pg3"}, nodes: map[string]testcontainers.Container{}}
	defer func() {
		if err != nil {
			_ = c.Terminate(context.Background())
		}
	}()
	c.etcd, err = c.run(ctx, "etcd", testcontainers.ContainerRequest{
		Image:      img,
		Cmd:        []string{"etcd"},
		Env:        map[string]string{"ETCD_ADVERTISE_HOST": "etcd"},
		WaitingFor: wait.ForLog("ready to serve client requests").WithStartupTimeout(60 * time.Second),
	})
	if err != nil {
		return nil, fmt.Errorf("patroni: start etcd from %s (run `make ha-image` to build it): %w", img, err)
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	var errs []error
	for _, name := range c.names {
		wg.Go(func() {
			ctr, err := c.run(ctx, name, testcontainers.ContainerRequest{
				Image: img,
				Cmd:   []string{"patroni"},
				Env: map[string]string{
					"HA_NAME": name, "HA_CONNECT_HOST": name, "HA_ETCD_HOSTS": "etcd:2379",
					"HA_SUPERUSER_PASSWORD": SuperPassword, "HA_REPLICATION_PASSWORD": "replicator",
					"HA_DB": Database, "HA_DB_USER": AppUser, "HA_DB_PASSWORD": AppPassword,
				},
				ExposedPorts:       []string{"5432/tcp", "8008/tcp"},
				HostConfigModifier: func(hc *dockercontainer.HostConfig) { hc.ShmSize = 256 << 20 },
				// Patroni's REST API answers /liveness once its loop runs.
				WaitingFor: wait.ForHTTP("/liveness").WithPort("8008/tcp").WithStartupTimeout(90 * time.Second),
			})
			mu.Lock()
			defer mu.Unlock()
			if ctr != nil {
				c.nodes[name] = ctr
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("patroni: start %s: %w", name, err))
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if _, err := c.WaitHealthy(ctx, timeout); err != nil {
		return nil, err
	}
	if c.pool, err = c.newPool(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// run starts one container on the network under alias. A container that
// failed to start is returned too, so that it can be terminated; its logs
// are in the error.
func (c *Cluster) run(ctx context.Context, alias string, req testcontainers.ContainerRequest) (testcontainers.Container, error) {
	req.Networks = []string{c.network}
	req.NetworkAliases = map[string][]string{c.network: {alias}}
	ctr, err := testcontainers.GenericContainer(ctx, testcontainers.GenericContainerRequest{ContainerRequest: req, Started: true})
	if err != nil && ctr != nil {
		err = fmt.Errorf("%w\n%s", err, tail(ctx, ctr))
	}
	return ctr, err
}

// tail is the end of a container's logs.
func tail(ctx context.Context, ctr testcontainers.Container) string {
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

// Terminate closes the pool and removes every container.
func (c *Cluster) Terminate(ctx context.Context) error {
	if c.pool != nil {
		c.pool.Close()
	}
	var errs []error
	for _, ctr := range c.nodes {
		errs = append(errs, testcontainers.TerminateContainer(ctr))
	}
	if c.etcd != nil {
		errs = append(errs, testcontainers.TerminateContainer(c.etcd))
	}
	return errors.Join(errs...)
}

// Nodes returns the nodes' names, which are also their host names on the
// network.
func (c *Cluster) Nodes() []string { return slices.Clone(c.names) }

// ContainerID returns a node's container, for faults of the caller's own
// (docker pause, say).
func (c *Cluster) ContainerID(name string) string { return c.nodes[name].GetContainerID() }

// URL is the connection string, as the application role, to the node that
// takes writes among hosts (host:port each; default: every node on the
// network, pg1:5432,pg2:5432,pg3:5432): what a tokengate replica on the
// network is given. Its connect timeout is per host, so a dead first host
// costs two seconds before the next is tried.
func (c *Cluster) URL(hosts ...string) string {
	if len(hosts) == 0 {
		for _, n := range c.names {
			hosts = append(hosts, n+":5432")
		}
	}
	return fmt.Sprintf("postgres://%s:%s@%s/%s?sslmode=disable&target_session_attrs=read-write&connect_timeout=2",
		AppUser, AppPassword, strings.Join(hosts, ","), Database)
}

// ReadURL is the connection string, as the application role, that a
// replica's reads pool is given (--read-database-url): a standby among
// hosts if one answers (target_session_attrs=prefer-standby), else the
// primary. hosts default to every node, as for URL.
func (c *Cluster) ReadURL(hosts ...string) string {
	return strings.Replace(c.URL(hosts...), "target_session_attrs=read-write", "target_session_attrs=prefer-standby", 1)
}

// NodeURL is the superuser's connection string to one node at its host
// port of the moment, for the test process to look at that node alone
// (whatever its role); params are added to the query, e.g.
// "default_transaction_read_only=off".
func (c *Cluster) NodeURL(ctx context.Context, name string, params ...string) (string, error) {
	addr, err := c.Addr(ctx, name)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("postgres://%s:%s@%s/%s?%s", SuperUser, SuperPassword, addr, Database,
		strings.Join(append([]string{"sslmode=disable", "connect_timeout=5"}, params...), "&")), nil
}

// Logs is the end of a node's logs (Patroni's and Postgres's), e.g. to
// tell how an old primary rejoined: rewound or cloned afresh.
func (c *Cluster) Logs(ctx context.Context, name string) (string, error) {
	ctr, ok := c.nodes[name]
	if !ok {
		return "", fmt.Errorf("patroni: no node %q", name)
	}
	return tail(ctx, ctr), nil
}

// Addr is where this process reaches a node's Postgres: its host port as it
// is now (a node started again may have a new one).
func (c *Cluster) Addr(ctx context.Context, name string) (string, error) {
	return c.hostPort(ctx, name, "5432/tcp")
}

func (c *Cluster) hostPort(ctx context.Context, name, port string) (string, error) {
	ctr, ok := c.nodes[name]
	if !ok {
		return "", fmt.Errorf("patroni: no node %q", name)
	}
	host, err := ctr.Host(ctx)
	if err != nil {
		return "", err
	}
	p, err := ctr.MappedPort(ctx, port)
	if err != nil {
		return "", fmt.Errorf("patroni: %s's port %s: %w", name, port, err)
	}
	return net.JoinHostPort(host, p.Port()), nil
}

// Pool is the test process's pool, as the superuser, on the node that
// takes writes. It needs no reconnecting: each new connection tries every
// node at its host port of the moment and keeps the writable one
// (target_session_attrs=read-write), and a connection to a node that died
// or was demoted fails and leaves the pool. Terminate closes it.
func (c *Cluster) Pool() *pgxpool.Pool { return c.pool }

func (c *Cluster) newPool(ctx context.Context) (*pgxpool.Pool, error) {
	hosts := make([]string, len(c.names))
	for i, n := range c.names {
		hosts[i] = n + ":5432"
	}
	cfg, err := pgxpool.ParseConfig(fmt.Sprintf("postgres://%s:%s@%s/%s?sslmode=disable&target_session_attrs=read-write&connect_timeout=3",
		SuperUser, SuperPassword, strings.Join(hosts, ","), Database))
	if err != nil {
		return nil, err
	}
	// The hosts are the nodes' names, which only the network resolves:
	// this process dials each at its host port, looked up at each dial.
	cfg.ConnConfig.LookupFunc = func(_ context.Context, host string) ([]string, error) { return []string{host}, nil }
	dialer := &net.Dialer{KeepAlive: 5 * time.Second}
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		name, _, _ := net.SplitHostPort(addr)
		hp, err := c.Addr(ctx, name)
		if err != nil {
			return nil, err
		}
		return dialer.DialContext(ctx, network, hp)
	}
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("patroni: the primary does not answer: %w", err)
	}
	return pool, nil
}

var restClient = &http.Client{}

// rest calls a node's Patroni REST API and decodes a JSON answer into out.
// A GET is given 3 s; a POST (a switchover, which Patroni answers once it
// is over) a minute.
func (c *Cluster) rest(ctx context.Context, name, method, path string, body, out any) error {
	timeout := 3 * time.Second
	if method != http.MethodGet {
		timeout = time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	hp, err := c.hostPort(ctx, name, "8008/tcp")
	if err != nil {
		return err
	}
	var rd io.Reader
	if body != nil {
		raw, _ := json.Marshal(body)
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://"+hp+path, rd)
	if err != nil {
		return err
	}
	resp, err := restClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("patroni: %s %s on %s: %d %s", method, path, name, resp.StatusCode, bytes.TrimSpace(raw))
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			return fmt.Errorf("patroni: %s %s on %s: %w: %s", method, path, name, err, raw)
		}
	}
	return nil
}

// running says whether a node's container runs (not killed, not stopped,
// not paused).
func (c *Cluster) running(ctx context.Context, name string) bool {
	st, err := c.nodes[name].State(ctx)
	return err == nil && st.Running && !st.Paused
}

// Members is the cluster as Patroni keeps it in etcd (GET /cluster), asked
// of each running node in turn.
func (c *Cluster) Members(ctx context.Context) ([]Member, error) {
	var last error = errors.New("no node runs")
	for _, name := range c.names {
		if !c.running(ctx, name) {
			continue
		}
		var v struct {
			Members []Member `json:"members"`
		}
		if err := c.rest(ctx, name, http.MethodGet, "/cluster", nil, &v); err != nil {
			last = err
			continue
		}
		return v.Members, nil
	}
	return nil, fmt.Errorf("patroni: GET /cluster: %w", last)
}

// Primary returns the name of the node that leads now.
func (c *Cluster) Primary(ctx context.Context) (string, error) {
	ms, err := c.Members(ctx)
	if err != nil {
		return "", err
	}
	for _, m := range ms {
		if m.Role == "leader" {
			return m.Name, nil
		}
	}
	return "", fmt.Errorf("patroni: no leader among %+v", ms)
}

// Kill is `docker kill`: SIGKILL to Patroni and Postgres at once, with no
// shutdown; a primary's leader key is left to expire (ttl 10 s), and
// then Patroni promotes the synchronous standby.
func (c *Cluster) Kill(ctx context.Context, name string) error {
	return c.docker(ctx, "kill", name)
}

// Start starts a killed or stopped node again with its data as it was: an
// old primary rejoins as a replica of the new one (pg_rewind, or a new
// base backup when the rewind fails).
func (c *Cluster) Start(ctx context.Context, name string) error {
	return c.docker(ctx, "start", name)
}

func (c *Cluster) docker(ctx context.Context, verb, name string) error {
	ctr, ok := c.nodes[name]
	if !ok {
		return fmt.Errorf("patroni: no node %q", name)
	}
	if out, err := exec.CommandContext(ctx, "docker", verb, ctr.GetContainerID()).CombinedOutput(); err != nil {
		return fmt.Errorf("patroni: docker %s %s: %w: %s", verb, name, err, bytes.TrimSpace(out))
	}
	return nil
}

// Switchover hands the leadership from the primary to the synchronous
// standby (POST /switchover, which Patroni answers once the standby
// leads), and returns both names. In synchronous mode only the
// synchronous standby may take over.
func (c *Cluster) Switchover(ctx context.Context) (from, to string, err error) {
	ms, err := c.Members(ctx)
	if err != nil {
		return "", "", err
	}
	for _, m := range ms {
		switch m.Role {
		case "leader":
			from = m.Name
		case "sync_standby":
			to = m.Name
		}
	}
	if from == "" || to == "" {
		return "", "", fmt.Errorf("patroni: a switchover needs a leader and a synchronous standby: %+v", ms)
	}
	req := map[string]string{"leader": from, "candidate": to}
	if err := c.rest(ctx, from, http.MethodPost, "/switchover", req, nil); err != nil {
		return from, to, err
	}
	return from, to, nil
}

// Configure changes the cluster's dynamic configuration (PATCH /config on
// the primary, which Patroni applies to every node): patch is merged into
// it, e.g. {"postgresql": {"parameters": {"synchronous_commit": "local"}}}.
func (c *Cluster) Configure(ctx context.Context, patch map[string]any) error {
	primary, err := c.Primary(ctx)
	if err != nil {
		return err
	}
	return c.rest(ctx, primary, http.MethodPatch, "/config", patch, nil)
}

// healthy reports whether, among the members but those in down, exactly
// one runs as the leader, one streams as its synchronous standby, and
// want of them are up in all.
func healthy(ms []Member, want int, down []string) bool {
	var leaders, syncs, n int
	for _, m := range ms {
		if slices.Contains(down, m.Name) {
			continue
		}
		if !m.up() {
			return false
		}
		n++
		switch m.Role {
		case "leader", "master", "primary":
			leaders++
		case "sync_standby":
			syncs++
		}
	}
	return leaders == 1 && syncs == 1 && n == want
}

// WaitHealthy waits up to timeout until every node but those in down is up:
// one leader, one synchronous standby, and the rest streaming replicas. It
// returns the members as last seen.
func (c *Cluster) WaitHealthy(ctx context.Context, timeout time.Duration, down ...string) ([]Member, error) {
	want := len(c.names) - len(down)
	return c.waitMembers(ctx, timeout, fmt.Sprintf("%d nodes up with a leader and a synchronous standby", want), func(ms []Member) bool {
		return healthy(ms, want, down)
	})
}

// WaitLeader waits up to timeout for a failover away from old: a leader
// other than old that runs, and a synchronous standby other than old that
// is up. It returns the new leader.
func (c *Cluster) WaitLeader(ctx context.Context, timeout time.Duration, old string) (string, error) {
	var leader string
	_, err := c.waitMembers(ctx, timeout, "a new leader and a synchronous standby", func(ms []Member) bool {
		leader = ""
		sync := false
		for _, m := range ms {
			if m.Name == old || !m.up() {
				continue
			}
			switch m.Role {
			case "leader", "master", "primary":
				leader = m.Name
			case "sync_standby":
				sync = true
			}
		}
		return leader != "" && sync
	})
	return leader, err
}

func (c *Cluster) waitMembers(ctx context.Context, timeout time.Duration, what string, ok func([]Member) bool) ([]Member, error) {
	deadline := time.Now().Add(timeout)
	for {
		ms, err := c.Members(ctx)
		if err == nil && ok(ms) {
			return ms, nil
		}
		if time.Now().After(deadline) {
			return ms, fmt.Errorf("patroni: timed out after %s waiting for %s: members %+v, %v", timeout, what, ms, err)
		}
		select {
		case <-ctx.Done():
			return ms, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}
