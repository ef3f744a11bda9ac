package patroni

import (
	"context"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

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
