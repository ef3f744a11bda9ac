package loadgen

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
)

// callTimeout bounds one call, as the HTTP mode's client does.
const callTimeout = 30 * time.Second

// rlsConns are the gRPC connections of a run: conns[i] serves cfg.RLS[i].
type rlsConns struct {
	conns [][]*grpc.ClientConn
}

// dialRLS opens cfg.RLSConns connections (default 1) to each address. The
// connections are made lazily by gRPC: an address that does not answer
// shows as errors in the report.
func dialRLS(cfg Config) (*rlsConns, error) {
	switch cfg.Descriptors {
	case "", DescriptorsTokengate:
		if cfg.Gateway == "" || len(cfg.Tenants) == 0 {
			return nil, errors.New("loadgen: the rate limit service needs a gateway credential and at least one tenant")
		}
	case DescriptorsTenant:
		if len(cfg.Tenants) == 0 {
			return nil, errors.New("loadgen: the rate limit service needs at least one tenant")
		}
	default:
		return nil, fmt.Errorf("loadgen: descriptors %q: want %q or %q", cfg.Descriptors, DescriptorsTokengate, DescriptorsTenant)
	}
	if cfg.Hits > math.MaxUint32 {
		return nil, fmt.Errorf("loadgen: hits above %d", uint32(math.MaxUint32))
	}
	n := max(1, cfg.RLSConns)
	c := &rlsConns{}
	for _, addr := range cfg.RLS {
		var pool []*grpc.ClientConn
		for range n {
			conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				c.conns = append(c.conns, pool)
				c.close()
				return nil, fmt.Errorf("loadgen: rate limit service %s: %w", addr, err)
			}
			pool = append(pool, conn)
		}
		c.conns = append(c.conns, pool)
	}
	return c, nil
}

func (c *rlsConns) close() {
	for _, pool := range c.conns {
		for _, conn := range pool {
			_ = conn.Close()
		}
	}
}

// workers are cfg.Concurrency callers of the rate limit service, as a
// gateway calls it: one descriptor per call (tenant, model, request_id,
// phase) and the cost as hits_addend; after an OK, when cfg.Settle, the
// stream-end call (phase=response, the same request_id) with the usage as
// hits. Request ids are unique across runs, so that a reservation is never
// found by its idempotency key from an earlier run. With DescriptorsTenant
// the descriptor is tenant alone, the same in both calls, and the calls
// carry a credential only if cfg.Gateway has one.
func (c *rlsConns) workers(cfg Config) []callFunc {
	hits := cfg.Hits
	if hits <= 0 {
		hits = PromptTokens + int64(cfg.MaxTokens)
	}
	prompt, completion := usage(cfg.MaxTokens)
	used := prompt + completion
	run := nonce()
	var md metadata.MD
	if cfg.Gateway != "" {
		md = metadata.Pairs("authorization", "Bearer "+strings.TrimSpace(cfg.Gateway))
	}
	entries := tokengateEntries
	if cfg.Descriptors == DescriptorsTenant {
		entries = tenantEntries
	}
	var seq atomic.Uint64
	workers := make([]callFunc, cfg.Concurrency)
	for w := range workers {
		pool := c.conns[w%len(c.conns)]
		client := rlsv3.NewRateLimitServiceClient(pool[(w/len(c.conns))%len(pool)])
		tenant := cfg.Tenants[w%len(cfg.Tenants)]
		workers[w] = func(ctx context.Context) sample {
			var id string
			if cfg.Descriptors != DescriptorsTenant {
				id = run + "-" + strconv.FormatUint(seq.Add(1), 36)
			}
			if md != nil {
				ctx = metadata.NewOutgoingContext(ctx, md)
			}
			call := func(ctx context.Context, phase string, hits int64) (*rlsv3.RateLimitResponse, error) {
				return shouldRateLimit(ctx, client, entries(tenant, cfg.Model, id, phase), hits)
			}
			return rlsOne(ctx, call, hits, used, cfg.Settle)
		}
	}
	return workers
}

// nonce is a run's prefix of request ids.
func nonce() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// tokengateEntries are tokengate's descriptor: who, what, which request
// and which end of it.
func tokengateEntries(tenant, model, id, phase string) []*ratelimitv3.RateLimitDescriptor_Entry {
	return []*ratelimitv3.RateLimitDescriptor_Entry{
		{Key: "tenant", Value: tenant}, {Key: "model", Value: model}, {Key: "request_id", Value: id}, {Key: "phase", Value: phase},
	}
}

// tenantEntries are a generic rate limit service's descriptor: the tenant
// alone, at both ends of a request.
func tenantEntries(tenant, _, _, _ string) []*ratelimitv3.RateLimitDescriptor_Entry {
	return []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "tenant", Value: tenant}}
}

// rlsCallFunc makes one call for a phase ("request" or "response") of a
// request, with hits as its hits_addend.
type rlsCallFunc func(ctx context.Context, phase string, hits int64) (*rlsv3.RateLimitResponse, error)

func rlsOne(ctx context.Context, call rlsCallFunc, hits, used int64, settle bool) sample {
	var s sample
	t0 := time.Now()
	resp, err := call(ctx, "request", hits)
	s.admit = time.Since(t0)
	switch {
	case err != nil && ctx.Err() != nil:
		return sample{error: true}
	case err != nil:
		s.outcome = failed // a gRPC error: the service could not decide
		return s
	case resp.GetOverallCode() == rlsv3.RateLimitResponse_OK:
		s.outcome = admitted
	default:
		s.outcome, s.limit = refused, limitOf(resp)
		return s
	}
	if settle {
		t1 := time.Now()
		resp, err := call(ctx, "response", used)
		s.settle = time.Since(t1)
		s.settled = err == nil && resp.GetOverallCode() == rlsv3.RateLimitResponse_OK
	}
	return s
}

func shouldRateLimit(ctx context.Context, client rlsv3.RateLimitServiceClient, entries []*ratelimitv3.RateLimitDescriptor_Entry, hits int64) (*rlsv3.RateLimitResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	return client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{
		Domain:      "tokengate",
		Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: entries}},
		HitsAddend:  uint32(hits),
	})
}

// limitOf names what refused a call: the limit a descriptor reports, or
// "no_decision" when none does (the service refused the call before
// deciding: an unknown gateway credential, a tenant outside its scope, an
// unknown tenant).
func limitOf(resp *rlsv3.RateLimitResponse) string {
	for _, st := range resp.GetStatuses() {
		if st.GetCode() == rlsv3.RateLimitResponse_OVER_LIMIT && st.GetCurrentLimit().GetName() != "" {
			return st.GetCurrentLimit().GetName()
		}
	}
	return "no_decision"
}
