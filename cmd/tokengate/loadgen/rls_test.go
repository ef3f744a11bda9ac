package loadgen

import (
	"context"
	"maps"
	"net"
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
