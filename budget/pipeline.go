package budget

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Decider decides a batch of one tenant's requests; *Store is one.
type Decider interface {
	Decide(ctx context.Context, tenantID string, ops []Op) ([]OpResult, error)
}

// answerer is a Decider that can tell whether the store answers at all
// (Store.Answering), so that a request whose turn never came is told apart
// from one stuck behind a store that hangs.
type answerer interface {
	Answering(ctx context.Context, since time.Time) bool
}

// PipelineConfig configures a Pipeline. Zero fields take defaults.
type PipelineConfig struct {
	// Timeout bounds how long a request waits for its turn, and then how
	// long each of its transaction's two round trips may take. Default 3 s.
	Timeout time.Duration
	// MaxBatch bounds how many requests one transaction decides. Default 128.
	MaxBatch int
	// MaxQueue bounds how many requests of one tenant may wait in this
	// replica; past it a request is refused at once with ErrBusy.
	// Default 4096.
	MaxQueue int
}

// Pipeline is how a replica decides: it queues each tenant's reserves,
// settles and releases, and keeps one transaction per tenant in flight.
// While it runs, new requests queue; the next transaction decides all of
// them (up to MaxBatch), in arrival order, under one row lock and one
// commit (Store.Decide).
//
// Why: a tenant's row takes about 1 / (lock hold time) transactions a
// second, and the hold time is round trips plus the time a Postgres backend
// and a Go goroutine wait to be scheduled, which grows with CPU contention.
// When every settle ran in a transaction of its own, 200 callers of one
// tenant queued 24 connections on one row lock, and under contention the
// queue outgrew the store timeout. Batching makes the number of
// transactions shrink as load grows, and a tenant never holds more than one
// connection of the replica, so other tenants are not starved of
// connections.
//
// Waiting is bounded and fair: requests of a tenant are decided first in,
// first out; tenants take connections from the pool in the order they ask
// (pgxpool's semaphore is FIFO); a request that waited Timeout without its
// batch starting is answered ErrBusy ("waited its turn too long"), or
// ErrUnavailable if the store answers nothing at all, and is never decided. A request whose batch began hears that batch's outcome, whatever
// its caller's context does meanwhile: the ledger may hold it.
type Pipeline struct {
	decider  Decider
	timeout  time.Duration
	maxBatch int
	maxQueue int

	mu     sync.Mutex
	queues map[string]*pipeQueue // a tenant present here has a drainer running
}

type pipeQueue struct {
	calls []*pipeCall
}

type pipeCall struct {
	op   Op
	done chan OpResult // buffered: the drainer never blocks on it
	// Guarded by Pipeline.mu.
	taken, abandoned bool
}

// NewPipeline returns a Pipeline deciding through d.
func NewPipeline(d Decider, cfg *PipelineConfig) *Pipeline {
	var c PipelineConfig
	if cfg != nil {
		c = *cfg
	}
	if c.Timeout <= 0 {
		c.Timeout = 3 * time.Second
	}
	if c.MaxBatch <= 0 {
		c.MaxBatch = 128
	}
	if c.MaxQueue <= 0 {
		c.MaxQueue = 4096
	}
	return &Pipeline{decider: d, timeout: c.Timeout, maxBatch: c.MaxBatch, maxQueue: c.MaxQueue, queues: map[string]*pipeQueue{}}
}

// Reserve is Store.Reserve through the pipeline.
func (p *Pipeline) Reserve(ctx context.Context, rp ReserveParams) (*Reservation, error) {
	r := p.do(ctx, rp.TenantID, Op{Reserve: &rp})
	return r.Reservation, r.Err
}

// Settle is Store.Settle through the pipeline.
func (p *Pipeline) Settle(ctx context.Context, sp SettleParams) (*Settlement, error) {
	r := p.do(ctx, sp.TenantID, Op{Settle: &sp})
	return r.Settlement, r.Err
}

// Release is Store.Release through the pipeline.
func (p *Pipeline) Release(ctx context.Context, rp ReleaseParams) (*Settlement, error) {
	r := p.do(ctx, rp.TenantID, Op{Release: &rp})
	return r.Settlement, r.Err
}

// ErrQueueFull wraps ErrBusy when a tenant's queue in this replica is full.
var ErrQueueFull = fmt.Errorf("%w: the tenant's queue in this replica is full", ErrBusy)

// do queues op and waits for its decision, or for its turn to run out.
func (p *Pipeline) do(ctx context.Context, tenantID string, op Op) OpResult {
	if err := ctx.Err(); err != nil {
		return OpResult{Err: err}
	}
	c := &pipeCall{op: op, done: make(chan OpResult, 1)}
	p.mu.Lock()
	q, running := p.queues[tenantID]
	if !running {
		q = &pipeQueue{}
		p.queues[tenantID] = q
	}
	if len(q.calls) >= p.maxQueue {
		p.mu.Unlock()
		return OpResult{Err: ErrQueueFull}
	}
	q.calls = append(q.calls, c)
	p.mu.Unlock()
	if !running {
		go p.drain(tenantID, q)
	}

	queued := time.Now()
	timer := time.NewTimer(p.timeout)
	defer timer.Stop()
	timedOut := false
	select {
	case r := <-c.done:
		return r
	case <-timer.C:
		timedOut = true
	case <-ctx.Done():
	}
	p.mu.Lock()
	if c.taken {
		p.mu.Unlock()
		return <-c.done // its transaction is running: its outcome is the ledger's
	}
	c.abandoned = true // before anything slow: no batch may take it now
	p.mu.Unlock()
	if !timedOut {
		return OpResult{Err: ctx.Err()}
	}
	err := fmt.Errorf("%w: waited its turn %s and the tenant's earlier requests were still being decided", ErrBusy, p.timeout)
	if a, ok := p.decider.(answerer); ok && !a.Answering(ctx, queued) {
		// The batch ahead is stuck because the store hangs.
		err = fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	return OpResult{Err: err}
}

// drain decides the tenant's queued requests, batch after batch, until the
// queue is empty.
func (p *Pipeline) drain(tenantID string, q *pipeQueue) {
	for {
		p.mu.Lock()
		batch := make([]*pipeCall, 0, min(len(q.calls), p.maxBatch))
		n := 0
		for _, c := range q.calls {
			if len(batch) == p.maxBatch {
				break
			}
			n++
			if c.abandoned {
				continue
			}
			c.taken = true
			batch = append(batch, c)
		}
		q.calls = q.calls[n:]
		if len(batch) == 0 && len(q.calls) == 0 {
			delete(p.queues, tenantID)
			p.mu.Unlock()
			return
		}
		p.mu.Unlock()
		if len(batch) == 0 {
			continue
		}

		ops := make([]Op, len(batch))
		for i, c := range batch {
			ops[i] = c.op
		}
		ctx, cancel := context.WithTimeout(context.Background(), p.timeout)
		results, err := p.decider.Decide(ctx, tenantID, ops)
		cancel()
		for i, c := range batch {
			switch {
			case err != nil:
				c.done <- OpResult{Err: err}
			case i < len(results):
				c.done <- results[i]
			default:
				c.done <- OpResult{Err: errors.New("budget: the decider returned too few results")}
			}
		}
	}
}
