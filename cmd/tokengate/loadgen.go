package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/tokengate/tokengate/cmd/tokengate/loadgen"
)

// loadgenCmd drives a running tokengate like a gateway does: over its HTTP
// API with tenant keys, or (--rls) over its rate limit service with a
// gateway credential (or, with --rls-descriptors tenant, as a generic rate
// limit service is called: tenant alone, no credential). It needs no
// database.
type loadgenCmd struct {
	URLs        []string      `name:"url" default:"http://localhost:8080" help:"tokengate's base URL (repeat for several replicas; workers take them round-robin)."`
	Keys        []string      `name:"key" env:"TG_KEY" help:"Tenant key(s) for the HTTP API; workers take them round-robin."`
	RLS         []string      `name:"rls" placeholder:"ADDR" help:"Drive the rate limit service (serve --rls-addr) at this host:port over gRPC instead of the HTTP API (repeat for several replicas; workers take them round-robin)."`
	RLSConns    int           `name:"rls-conns" default:"1" help:"gRPC connections per --rls address (calls are multiplexed over each)."`
	Gateway     string        `name:"gateway" env:"TG_GATEWAY" placeholder:"CRED" help:"With --rls: the gateway credential (tgw_...); optional with --rls-descriptors tenant."`
	Descriptors string        `name:"rls-descriptors" enum:"tokengate,tenant" default:"tokengate" help:"With --rls: the descriptor each call sends: tokengate's (tenant, model, request_id, phase), or tenant (the single entry tenant=NAME, as a generic rate limit service such as envoyproxy/ratelimit counts per tenant; the stream end repeats it with the usage as hits)."`
	Tenants     []string      `name:"tenant" help:"With --rls: the tenant(s) the calls name; workers take them round-robin."`
	Hits        int64         `name:"hits" default:"0" help:"With --rls: each call's cost (hits_addend); 0: what the HTTP API estimates for the HTTP mode's request, its prompt's tokens + --max-tokens."`
	Concurrency int           `name:"concurrency" default:"32" help:"Requests in flight."`
	Duration    time.Duration `name:"duration" default:"10s" help:"How long to run."`
	Rate        float64       `name:"rate" default:"0" help:"Admissions per second in all (0: as fast as possible)."`
	Model       string        `name:"model" default:"gpt-4o-mini" help:"Model of the requests."`
	MaxTokens   int           `name:"max-tokens" default:"100" help:"max_tokens of the requests."`
	Settle      bool          `name:"settle" default:"true" negatable:"" help:"Settle each admission with usage (with --rls: a phase=response call with the same request_id)."`
	IdemKeys    bool          `name:"idempotency-keys" help:"HTTP API: send each admission with an Idempotency-Key of its own (as a client that retries safely does; the rate limit service always keys a reservation by its request id)."`
	NetHTTP     bool          `name:"net-http" help:"HTTP API: call through Go's net/http client, not fasthttp (the load generator then spends 1.5x-2x the CPU per call, on the cores it shares with what it measures)."`
	JSON        bool          `name:"json" help:"Print the report as JSON (for scripts)."`
}

func (c loadgenCmd) Run(ctx context.Context, g *globals) error {
	cfg := loadgen.Config{URLs: c.URLs, Keys: c.Keys, Concurrency: c.Concurrency, Duration: c.Duration,
		Rate: c.Rate, Model: c.Model, MaxTokens: c.MaxTokens, Settle: c.Settle, IdempotencyKeys: c.IdemKeys}
	if c.NetHTTP {
		cfg.Client = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
			MaxIdleConnsPerHost: c.Concurrency, MaxIdleConns: c.Concurrency * max(1, len(c.URLs))}}
	}
	switch {
	case len(c.RLS) > 0:
		desc := loadgen.Descriptors(c.Descriptors)
		switch {
		case len(c.Tenants) == 0:
			return errors.New("loadgen --rls needs --tenant")
		case c.Gateway == "" && desc != loadgen.DescriptorsTenant:
			return errors.New("loadgen --rls needs --gateway (or TG_GATEWAY), unless --rls-descriptors tenant")
		}
		cfg.URLs, cfg.Keys = nil, nil
		cfg.RLS, cfg.RLSConns, cfg.Gateway, cfg.Tenants, cfg.Hits, cfg.Descriptors = c.RLS, c.RLSConns, c.Gateway, c.Tenants, c.Hits, desc
	case len(c.Keys) == 0:
		return errors.New("loadgen needs --key (or TG_KEY), or --rls with --tenant (and --gateway)")
	}
	r, err := loadgen.Run(ctx, cfg)
	if err != nil {
		return err
	}
	if c.JSON {
		return json.NewEncoder(g.stdout).Encode(r)
	}
	fmt.Fprintln(g.stdout, r)
	return nil
}
