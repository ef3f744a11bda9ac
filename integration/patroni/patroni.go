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
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
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

// Logs is the end of a node's logs (Patroni's and Postgres's), e.g. to
// tell how an old primary rejoined: rewound or cloned afresh.
func (c *Cluster) Logs(ctx context.Context, name string) (string, error) {
	ctr, ok := c.nodes[name]
	if !ok {
		return "", fmt.Errorf("patroni: no node %q", name)
	}
	return tail(ctx, ctr), nil
}
