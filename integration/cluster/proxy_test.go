//go:build cluster && soak

package cluster_test

import (
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// pgProxies puts a TCP proxy (toxiproxy, run in this process) between each
// replica and Postgres, so the soak can cut one replica's connections
// mid-flight and slow Postgres's answers to it, as a flaky network would.
// The replicas reach the proxies through their network's gateway. On a
// Patroni cluster each replica has one proxy for each node, and its URL
// names them all: a cut or a delay strikes its path to every node.
type pgProxies struct {
	t       *testing.T
	server  *toxiproxy.ApiServer
	mu      sync.Mutex
	proxies map[string][]*nodeProxy // by replica
}

// nodeProxy is one replica's proxy to one node ("" for the one Postgres).
type nodeProxy struct {
	node  string
	proxy *toxiproxy.Proxy
}

func newPGProxies(t *testing.T) *pgProxies {
	return &pgProxies{t: t, proxies: map[string][]*nodeProxy{},
		server: toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())}
}

// upstream is Postgres's address as this process reaches it: the one
// Postgres's, or the Patroni node's.
func upstream(t *testing.T, c *cluster, node string) string {
	if c.ha != nil {
		addr, err := c.ha.Addr(ctx, node)
		if err != nil {
			t.Fatal(err)
		}
		return addr
	}
	port, err := c.pg.MappedPort(ctx, "5432/tcp")
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort("127.0.0.1", port.Port())
}

// env starts the proxies of one replica and returns the database URL that
// sends the replica through them.
func (p *pgProxies) env(c *cluster, name string) map[string]string {
	nodes := []string{""}
	if c.ha != nil {
		nodes = c.ha.Nodes()
	}
	gw := c.gateway()
	var hosts []string
	for _, node := range nodes {
		proxy := toxiproxy.NewProxy(p.server, name+"/"+node, "0.0.0.0:0", upstream(p.t, c, node))
		if err := proxy.Start(); err != nil {
			p.t.Fatal(err)
		}
		p.t.Cleanup(proxy.Stop)
		_, port, _ := net.SplitHostPort(proxy.Listen)
		hosts = append(hosts, net.JoinHostPort(gw, port))
		p.mu.Lock()
		p.proxies[name] = append(p.proxies[name], &nodeProxy{node: node, proxy: proxy})
		p.mu.Unlock()
	}
	if c.ha != nil {
		return map[string]string{"TOKENGATE_DATABASE_URL": c.ha.URL(hosts...)}
	}
	return map[string]string{"TOKENGATE_DATABASE_URL": fmt.Sprintf(
		"postgres://postgres:postgres@%s/tokengate?sslmode=disable&connect_timeout=2", hosts[0])}
}

// retarget points the proxies to node ("" for the one Postgres) at it
// again after a restart, which may have moved its host port, and starts
// those that down stopped.
func (p *pgProxies) retarget(c *cluster, node string) {
	up := upstream(p.t, c, node)
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, ps := range p.proxies {
		for _, np := range ps {
			if np.node != node {
				continue
			}
			if err := np.proxy.Update(&toxiproxy.Proxy{Listen: np.proxy.Listen, Upstream: up, Enabled: true}); err != nil {
				p.t.Fatal(err)
			}
		}
	}
}

// down stops the proxies to a node that was killed, until retarget: its
// host port is free while it is down, and may be another container's.
func (p *pgProxies) down(node string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, ps := range p.proxies {
		for _, np := range ps {
			if np.node == node {
				np.proxy.Stop()
			}
		}
	}
}

func (p *pgProxies) get(name string) []*nodeProxy {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.proxies[name]
}

// cut closes every connection of a replica to Postgres and refuses new
// ones for d, then lets them through again.
func (p *pgProxies) cut(name string, d time.Duration) {
	ps := p.get(name)
	for _, np := range ps {
		np.proxy.Stop()
	}
	time.Sleep(d) // real time: how long the connections stay cut is the fault
	for _, np := range ps {
		if err := np.proxy.Start(); err != nil {
			p.t.Errorf("proxy %s/%s: start again: %v", name, np.node, err)
		}
	}
}

// slow delays every answer Postgres sends a replica by latency (plus up
// to jitter) for d.
func (p *pgProxies) slow(name string, latency, jitter, d time.Duration) {
	ps := p.get(name)
	toxic := fmt.Sprintf(`{"name":"slow","type":"latency","stream":"downstream","attributes":{"latency":%d,"jitter":%d}}`,
		latency.Milliseconds(), jitter.Milliseconds())
	var slowed []*nodeProxy
	for _, np := range ps {
		if _, err := np.proxy.Toxics.AddToxicJson(strings.NewReader(toxic)); err != nil {
			p.t.Errorf("proxy %s/%s: add latency: %v", name, np.node, err)
			continue
		}
		slowed = append(slowed, np)
	}
	time.Sleep(d) // real time: how long Postgres stays slow is the fault
	for _, np := range slowed {
		if err := np.proxy.Toxics.RemoveToxic(ctx, "slow"); err != nil {
			p.t.Errorf("proxy %s/%s: remove latency: %v", name, np.node, err)
		}
	}
}
