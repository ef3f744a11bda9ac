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
// The replicas reach the proxies through their network's gateway.
type pgProxies struct {
	t       *testing.T
	server  *toxiproxy.ApiServer
	mu      sync.Mutex
	proxies map[string]*toxiproxy.Proxy
}

func newPGProxies(t *testing.T) *pgProxies {
	return &pgProxies{t: t, proxies: map[string]*toxiproxy.Proxy{},
		server: toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())}
}

// upstream is Postgres's address as this process reaches it.
func upstream(t *testing.T, c *cluster) string {
	port, err := c.pg.MappedPort(ctx, "5432/tcp")
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort("127.0.0.1", port.Port())
}

// env starts a proxy for one replica and returns the database URL that
// sends the replica through it.
func (p *pgProxies) env(c *cluster, name string) map[string]string {
	proxy := toxiproxy.NewProxy(p.server, name, "0.0.0.0:0", upstream(p.t, c))
	if err := proxy.Start(); err != nil {
		p.t.Fatal(err)
	}
	p.t.Cleanup(proxy.Stop)
	_, port, _ := net.SplitHostPort(proxy.Listen)
	p.mu.Lock()
	p.proxies[name] = proxy
	p.mu.Unlock()
	return map[string]string{"TOKENGATE_DATABASE_URL": fmt.Sprintf(
		"postgres://postgres:postgres@%s:%s/tokengate?sslmode=disable&connect_timeout=2", c.gateway(), port)}
}

// retarget points every proxy at Postgres again after a restart, which
// may have moved its host port.
func (p *pgProxies) retarget(c *cluster) {
	up := upstream(p.t, c)
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, proxy := range p.proxies {
		if err := proxy.Update(&toxiproxy.Proxy{Listen: proxy.Listen, Upstream: up, Enabled: true}); err != nil {
			p.t.Fatal(err)
		}
	}
}

func (p *pgProxies) get(name string) *toxiproxy.Proxy {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.proxies[name]
}

// cut closes every connection of a replica to Postgres and refuses new
// ones for d, then lets them through again.
func (p *pgProxies) cut(name string, d time.Duration) {
	proxy := p.get(name)
	proxy.Stop()
	time.Sleep(d)
	if err := proxy.Start(); err != nil {
		p.t.Errorf("proxy %s: start again: %v", name, err)
	}
}

// slow delays every answer Postgres sends a replica by latency (plus up
// to jitter) for d.
func (p *pgProxies) slow(name string, latency, jitter, d time.Duration) {
	proxy := p.get(name)
	toxic := fmt.Sprintf(`{"name":"slow","type":"latency","stream":"downstream","attributes":{"latency":%d,"jitter":%d}}`,
		latency.Milliseconds(), jitter.Milliseconds())
	if _, err := proxy.Toxics.AddToxicJson(strings.NewReader(toxic)); err != nil {
		p.t.Errorf("proxy %s: add latency: %v", name, err)
		return
	}
	time.Sleep(d)
	if err := proxy.Toxics.RemoveToxic(ctx, "slow"); err != nil {
		p.t.Errorf("proxy %s: remove latency: %v", name, err)
	}
}
