// The gate: how many request bytes a replica parses and counts at once.

package estimator

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/semaphore"
)

// ErrBusy is returned by [Gate.Acquire] when the caller's turn did not
// come within the gate's wait: the replica is estimating as many bytes as
// it allows, and the caller may retry shortly. Faces answer it 503 with
// Retry-After, never as an error of the request.
var ErrBusy = errors.New("estimator busy: this replica is estimating as many request bytes as it allows")

// DefaultGateWait is how long a caller waits for its turn to be estimated
// unless configured: as long as a decision waits for its turn in the
// store's pipeline (account.DefaultStoreTimeout).
const DefaultGateWait = 3 * time.Second

// DefaultGateBytes is the gate's size unless configured: 8 MiB of bodies
// per core, at least 16 MiB and at most 64 MiB. Counting is CPU bound, so
// more bytes in flight than the cores can count only wait, holding the
// memory of their parse; two cores count two 4 MiB bodies at once, and
// the other two wait their turn parsed.
func DefaultGateBytes() int64 {
	return min(max(int64(runtime.GOMAXPROCS(0))*(8<<20), 16<<20), 64<<20)
}

// GateConfig configures a [Gate]. Zero fields take defaults.
type GateConfig struct {
	// Bytes is the most request body bytes estimated at once, on every
	// face of the replica. Default DefaultGateBytes().
	Bytes int64
	// TenantBytes is the most of them one tenant may hold (or one body
	// larger than it), so that one tenant flooding the replica with large
	// bodies leaves the rest to the others. Default a quarter of Bytes.
	// Bytes should be larger than the largest body accepted, so that no
	// one body takes the whole gate.
	TenantBytes int64
	// Wait bounds how long a caller waits for its turn. Default
	// DefaultGateWait.
	Wait time.Duration
}

// Gate bounds the request bytes a replica estimates at once: the memory
// of parsing and counting a body is a multiple of its size whatever it
// holds, so bounding the bytes bounds the memory. Callers take their
// body's size in bytes before parsing it and give it back once it is
// estimated; past the replica's bytes or their tenant's share they wait
// in turn (first come, first served), for at most the gate's wait. It is
// safe for concurrent use; a nil *Gate admits everything at once.
type Gate struct {
	cfg   GateConfig
	total *semaphore.Weighted

	mu      sync.Mutex
	tenants map[string]*tenantGate

	inUse    atomic.Int64
	waits    atomic.Int64
	refusals atomic.Int64
}

type tenantGate struct {
	sem  *semaphore.Weighted
	refs int // callers holding or waiting for sem
}

// NewGate returns a Gate.
func NewGate(cfg GateConfig) *Gate {
	if cfg.Bytes <= 0 {
		cfg.Bytes = DefaultGateBytes()
	}
	if cfg.TenantBytes <= 0 {
		cfg.TenantBytes = max(cfg.Bytes/4, 1)
	}
	cfg.TenantBytes = min(cfg.TenantBytes, cfg.Bytes)
	if cfg.Wait <= 0 {
		cfg.Wait = DefaultGateWait
	}
	return &Gate{cfg: cfg, total: semaphore.NewWeighted(cfg.Bytes), tenants: map[string]*tenantGate{}}
}

// Config returns the gate's configuration, defaults applied.
func (g *Gate) Config() GateConfig { return g.cfg }

// GateStats are a gate's figures for its metrics.
type GateStats struct {
	// InUse is the bytes being estimated now.
	InUse int64
	// Waits counts the callers that had to wait for their turn, Refusals
	// those whose turn did not come within the wait.
	Waits, Refusals int64
}

// Stats returns the gate's figures.
func (g *Gate) Stats() GateStats {
	return GateStats{InUse: g.inUse.Load(), Waits: g.waits.Load(), Refusals: g.refusals.Load()}
}

// Acquire takes n bytes of the gate for tenantID's body, waiting for its
// turn at most the gate's wait (or until ctx ends), and returns the
// function that gives them back. A body larger than the tenant's share
// takes the whole share (the tenant's other bodies wait), and one larger
// than the gate takes the whole gate: it runs alone. Past the wait it returns [ErrBusy]; if ctx ends first, ctx's
// error.
func (g *Gate) Acquire(ctx context.Context, tenantID string, n int64) (release func(), err error) {
	if g == nil || n <= 0 {
		return func() {}, nil
	}
	tn, gn := min(n, g.cfg.TenantBytes), min(n, g.cfg.Bytes)
	t := g.tenant(tenantID)
	if t.sem.TryAcquire(tn) {
		if g.total.TryAcquire(gn) {
			return g.held(tenantID, t, tn, gn), nil
		}
		t.sem.Release(tn)
	}
	g.waits.Add(1)
	wctx, cancel := context.WithTimeout(ctx, g.cfg.Wait)
	defer cancel()
	if err := t.sem.Acquire(wctx, tn); err != nil {
		g.untenant(tenantID, t)
		return nil, g.refused(ctx)
	}
	if err := g.total.Acquire(wctx, gn); err != nil {
		t.sem.Release(tn)
		g.untenant(tenantID, t)
		return nil, g.refused(ctx)
	}
	return g.held(tenantID, t, tn, gn), nil
}

// refused is the error of a wait that ended: the caller's own end, or
// ErrBusy when the gate's wait ran out.
func (g *Gate) refused(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	g.refusals.Add(1)
	return ErrBusy
}

func (g *Gate) held(tenantID string, t *tenantGate, tn, gn int64) func() {
	g.inUse.Add(gn)
	var once sync.Once
	return func() {
		once.Do(func() {
			g.inUse.Add(-gn)
			g.total.Release(gn)
			t.sem.Release(tn)
			g.untenant(tenantID, t)
		})
	}
}

// tenant returns tenantID's share, counting the caller in it.
func (g *Gate) tenant(tenantID string) *tenantGate {
	g.mu.Lock()
	defer g.mu.Unlock()
	t, ok := g.tenants[tenantID]
	if !ok {
		t = &tenantGate{sem: semaphore.NewWeighted(g.cfg.TenantBytes)}
		g.tenants[tenantID] = t
	}
	t.refs++
	return t
}

// untenant counts a caller out of its tenant's share, forgetting the
// share when no caller holds or waits for it.
func (g *Gate) untenant(tenantID string, t *tenantGate) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if t.refs--; t.refs == 0 {
		delete(g.tenants, tenantID)
	}
}
