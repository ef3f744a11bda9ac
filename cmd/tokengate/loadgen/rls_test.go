package loadgen

import (
	"context"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// fakeRLS answers as tokengate's rate limit service does, and checks the
// calls a gateway makes: the credential, one descriptor with tenant, model,
// request_id and phase, the cost as hits, and a stream-end call only for a
// request it admitted, with the usage.
type fakeRLS struct {
	rlsv3.UnimplementedRateLimitServiceServer
	t *testing.T

	mu       sync.Mutex
	reserved map[string]uint32 // by request_id
	settled  map[string]uint32
	tenants  map[string]int
}

func (f *fakeRLS) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	if got := md.Get("authorization"); len(got) != 1 || got[0] != "Bearer tgw_good" {
		return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT,
			Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: rlsv3.RateLimitResponse_OVER_LIMIT}}}, nil
	}
	if len(req.Descriptors) != 1 {
		return nil, status.Error(codes.InvalidArgument, "one descriptor")
	}
	e := map[string]string{}
	for _, x := range req.Descriptors[0].Entries {
		e[x.Key] = x.Value
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	ok := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}
	switch {
	case e["model"] != "m1" || e["request_id"] == "":
		return nil, status.Errorf(codes.InvalidArgument, "entries %v", e)
	case e["phase"] == "request" && e["tenant"] == "full":
		return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT,
			Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: rlsv3.RateLimitResponse_OVER_LIMIT,
				CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{Name: "tokens"}}}}, nil
	case e["phase"] == "request":
		if _, seen := f.reserved[e["request_id"]]; seen {
			f.t.Errorf("request_id %s reserved twice", e["request_id"])
		}
		f.reserved[e["request_id"]] = req.HitsAddend
		f.tenants[e["tenant"]]++
		return ok, nil
	case e["phase"] == "response":
		if _, seen := f.reserved[e["request_id"]]; !seen {
			f.t.Errorf("request_id %s settled without a reservation", e["request_id"])
		}
		f.settled[e["request_id"]] = req.HitsAddend
		return ok, nil
	}
	return nil, status.Errorf(codes.InvalidArgument, "phase %q", e["phase"])
}

// seen is what the service saw so far: reservations and settles by
// request_id, and reservations by tenant.
func (f *fakeRLS) seen() (reserved, settled map[string]uint32, tenants map[string]int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.reserved), maps.Clone(f.settled), maps.Clone(f.tenants)
}

func serveFake(t *testing.T) (*fakeRLS, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeRLS{t: t, reserved: map[string]uint32{}, settled: map[string]uint32{}, tenants: map[string]int{}}
	gs := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(gs, f)
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
	return f, ln.Addr().String()
}

func TestRLS(t *testing.T) {
	t.Parallel()
	f, addr := serveFake(t)
	cfg := Config{RLS: []string{addr, addr}, RLSConns: 2, Gateway: "tgw_good", Tenants: []string{"acme", "globex", "full"},
		Concurrency: 6, Duration: 300 * time.Millisecond, Model: "m1", MaxTokens: 90, Settle: true}
	r, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	reserved, settled, tenants := f.seen()
	if r.Errors != 0 || r.Admitted == 0 || r.Rejected["tokens"] == 0 || r.Requests != r.Admitted+r.Rejected["tokens"] {
		t.Fatalf("report: %s", r)
	}
	if r.Admitted != len(reserved) || r.Settled != len(settled) || r.Settled != r.Admitted {
		t.Fatalf("report %s; the service saw %d reservations and %d settles", r, len(reserved), len(settled))
	}
	if tenants["acme"] == 0 || tenants["globex"] == 0 {
		t.Fatalf("tenants %v: workers take them round-robin", tenants)
	}
	for id, hits := range reserved {
		if hits != PromptTokens+90 || settled[id] != 30+30 {
			t.Fatalf("request %s: reserved %d, settled %d", id, hits, settled[id])
		}
	}
	if r.AdmitLatency.P99 == 0 || r.SettleLatency.P99 == 0 {
		t.Fatalf("latencies: %s", r)
	}

	// Without settles, with a fixed cost, at a rate.
	cfg.Settle, cfg.Hits, cfg.Tenants, cfg.Rate = false, 7, []string{"acme"}, 100
	r, err = Run(context.Background(), cfg)
	reserved2, settled2, _ := f.seen()
	if err != nil || r.Errors != 0 || r.Settled != 0 || len(settled2) != len(settled) || r.Admitted == 0 || r.Admitted > 40 {
		t.Fatalf("no settle, 100/s for 0.3 s: %s, %v", r, err)
	}
	for id, hits := range reserved2 {
		if _, before := reserved[id]; !before && hits != 7 {
			t.Fatalf("request %s: reserved %d, want --hits 7", id, hits)
		}
	}
}

func TestRLSRefusedWithoutDecision(t *testing.T) {
	t.Parallel()
	_, addr := serveFake(t)
	r, err := Run(context.Background(), Config{RLS: []string{addr}, Gateway: "tgw_bad", Tenants: []string{"acme"},
		Concurrency: 2, Duration: 100 * time.Millisecond, Model: "m1", Settle: true})
	if err != nil || r.Admitted != 0 || r.Rejected["no_decision"] == 0 || r.Settled != 0 {
		t.Fatalf("%s, %v", r, err)
	}
	if _, err := Run(context.Background(), Config{RLS: []string{addr}, Tenants: []string{"acme"}}); err == nil {
		t.Fatal("no gateway credential: want an error")
	}
}

func TestRLSUnreachable(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	r, err := Run(context.Background(), Config{RLS: []string{addr}, Gateway: "tgw_good", Tenants: []string{"acme"},
		Concurrency: 2, Duration: 100 * time.Millisecond, Model: "m1"})
	if err != nil || r.Errors == 0 || r.Admitted != 0 {
		t.Fatalf("%s, %v", r, err)
	}
}

// fakePeer answers as a generic rate limit service (envoyproxy/ratelimit
// with a limit on the key tenant) does, and records each call: its
// descriptors, its hits and whether it carried a credential. It refuses
// the tenant "full".
type fakePeer struct {
	rlsv3.UnimplementedRateLimitServiceServer

	mu    sync.Mutex
	calls []peerCall
}

type peerCall struct {
	domain      string
	descriptors [][]string // key=value entries, by descriptor
	hits        uint32
	credential  bool
}

func (f *fakePeer) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	c := peerCall{domain: req.Domain, hits: req.HitsAddend, credential: len(md.Get("authorization")) > 0}
	over := false
	for _, d := range req.Descriptors {
		var entries []string
		for _, e := range d.Entries {
			entries = append(entries, e.Key+"="+e.Value)
			over = over || e.Value == "full"
		}
		c.descriptors = append(c.descriptors, entries)
	}
	f.mu.Lock()
	f.calls = append(f.calls, c)
	f.mu.Unlock()
	if over {
		return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT,
			Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: rlsv3.RateLimitResponse_OVER_LIMIT}}}, nil
	}
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: rlsv3.RateLimitResponse_OK}}}, nil
}

func (f *fakePeer) seen() []peerCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

func serveFakePeer(t *testing.T) (*fakePeer, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakePeer{}
	gs := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(gs, f)
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
	return f, ln.Addr().String()
}

func TestRLSDescriptorsTenant(t *testing.T) {
	t.Parallel()
	f, addr := serveFakePeer(t)
	cfg := Config{RLS: []string{addr}, RLSConns: 2, Descriptors: DescriptorsTenant, Tenants: []string{"acme", "globex", "full"},
		Concurrency: 6, Duration: 300 * time.Millisecond, Model: "m1", MaxTokens: 90, Settle: true}
	r, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if r.Errors != 0 || r.Admitted == 0 || r.Rejected["no_decision"] == 0 || r.Settled != r.Admitted ||
		r.Requests != r.Admitted+r.Rejected["no_decision"] || r.SettleLatency.P50 == 0 {
		t.Fatalf("report: %s", r)
	}
	// Each call: domain tokengate, one descriptor whose one entry is the
	// tenant, no credential; an admit costs the estimate (31 + 90), a
	// stream end the usage (30 + 90/3), and only a tenant admitted is
	// charged its usage.
	admits, settles := map[string]int{}, map[string]int{}
	for _, c := range f.seen() {
		if c.domain != "tokengate" || len(c.descriptors) != 1 || len(c.descriptors[0]) != 1 || c.credential {
			t.Fatalf("call %+v: want domain tokengate, one descriptor with one entry, no credential", c)
		}
		tenant, ok := strings.CutPrefix(c.descriptors[0][0], "tenant=")
		if !ok {
			t.Fatalf("call %+v: want the entry tenant=NAME", c)
		}
		switch c.hits {
		case PromptTokens + 90:
			admits[tenant]++
		case 30 + 30:
			settles[tenant]++
		default:
			t.Fatalf("call %+v: hits %d, want %d (admit) or %d (usage)", c, c.hits, PromptTokens+90, 30+30)
		}
	}
	if admits["acme"] == 0 || admits["globex"] == 0 || admits["full"] != r.Rejected["no_decision"] || settles["full"] != 0 {
		t.Fatalf("admits %v, settles %v; report %s", admits, settles, r)
	}
	if admits["acme"]+admits["globex"] != r.Admitted || settles["acme"]+settles["globex"] != r.Settled ||
		settles["acme"] != admits["acme"] || settles["globex"] != admits["globex"] {
		t.Fatalf("admits %v, settles %v; report %s", admits, settles, r)
	}

	// Without settles, with a fixed cost and a credential given anyway:
	// one call per request, and the credential is sent.
	before := len(f.seen())
	cfg.Settle, cfg.Hits, cfg.Tenants, cfg.Gateway = false, 7, []string{"acme"}, "tgw_any"
	if r, err = Run(context.Background(), cfg); err != nil || r.Errors != 0 || r.Admitted == 0 || r.Settled != 0 {
		t.Fatalf("no settle: %s, %v", r, err)
	}
	calls := f.seen()[before:]
	if len(calls) != r.Requests {
		t.Fatalf("%d calls for %d requests", len(calls), r.Requests)
	}
	for _, c := range calls {
		if c.hits != 7 || !c.credential || !slices.Equal(c.descriptors[0], []string{"tenant=acme"}) {
			t.Fatalf("call %+v: want tenant=acme, hits 7, the credential", c)
		}
	}
}

func TestRLSDescriptorsInvalid(t *testing.T) {
	t.Parallel()
	for _, cfg := range []Config{
		{RLS: []string{"127.0.0.1:1"}, Descriptors: DescriptorsTenant},
		{RLS: []string{"127.0.0.1:1"}, Descriptors: "peer", Tenants: []string{"acme"}},
	} {
		if _, err := Run(context.Background(), cfg); err == nil {
			t.Fatalf("%+v: want an error", cfg)
		}
	}
}
