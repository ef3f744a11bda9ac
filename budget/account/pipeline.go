package account

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"sync"
	"time"

	"github.com/tokengate/tokengate/budget/rule"
)

// Decider decides a batch of requests of any tenants; *Store is one.
type Decider interface {
	DecideBatch(ctx context.Context, items []Item) ([]OpResult, error)
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
	// MaxBatch and MaxBatchBytes bound one transaction: how many requests
	// it decides, and about how many bytes they send. Default 512 and 1 MiB.
	MaxBatch      int
	MaxBatchBytes int
	// MaxQueue bounds how many requests may wait in one shard; past it a
	// request is refused at once with ErrQueueFull. Default 16384.
	MaxQueue int
	// Shards is how many transactions the pipeline keeps in flight at
	// once, each for its own share of the tenants (by a hash of the id).
	// Default 4.
	Shards int
	// Gather is how long a shard's next transaction may wait, once a busy
	// one (GatherFrom requests or more) has answered, for as many requests
	// again as that one decided to queue behind those already waiting: the
	// callers it answered send their next request within a round trip of
	// their own. Zero: never wait. The wait is at most the answered
	// transaction's own duration, and a shard whose batches are small never
	// waits, so a light load pays no latency for it.
	Gather time.Duration
	// Tracer follows each transaction (pipeline_trace.go), which the
	// decisions it carried are linked to. Nil: no tracing, and no work for
	// it.
	Tracer PipelineTracer
}

// GatherFrom is the smallest batch after which a shard gathers
// (PipelineConfig.Gather): below it the load is light and a request is
// decided as soon as the transaction before it ends.
const GatherFrom = 8

// Pipeline is how a replica decides: requests of every tenant queue, and
// each shard keeps one transaction in flight. While it runs, new requests
// queue; the next transaction decides everything queued (up to MaxBatch),
// whatever the tenants, in arrival order, under one statement's row locks
// and one commit (Store.DecideBatch).
//
// Why: a commit costs a WAL flush and a tenant's row takes about
// 1 / (lock hold time) transactions a second, and the hold time is round
// trips plus the time a Postgres backend and a Go goroutine wait to be
// scheduled, which grows with CPU contention. Batching makes the number of
// transactions shrink as load grows, instead of the queue on a row lock,
// and a shard never holds more than one of the replica's connections.
//
// Waiting is bounded and fair: a tenant always maps to one shard, whose
// queue is first in, first out, so each tenant's requests are decided in
// arrival order; shards take connections from the pool in the order they
// ask (pgxpool's semaphore is FIFO); a request that waited Timeout without
// its batch starting is answered ErrBusy ("waited its turn too long"), or
// ErrUnavailable if the store answers nothing at all, and is never decided.
// A request whose batch began hears that batch's outcome, whatever its
// caller's context does meanwhile: the ledger may hold it.
type Pipeline struct {
	decider  Decider
	timeout  time.Duration
	gather   time.Duration
	maxBatch int
	maxBytes int
	maxQueue int
	shards   []*shard
	tracer   PipelineTracer // nil: not traced
}

type shard struct {
	mu      sync.Mutex
	calls   []*pipeCall
	running bool
	// While the drainer gathers, want is the queue length it waits for;
	// the call that reaches it sends on grown (buffered) and clears want.
	want  int
	grown chan struct{}
}

type pipeCall struct {
	item Item
	// group is a ReserveAll's items (item is then unused), decided in one
	// batch, all or none. Nil for one request, which costs no slice.
	group []Item
	bytes int
	// result (results for a group) is the decision, set before done is
	// sent on.
	result  OpResult
	results []OpResult
	done    chan struct{} // buffered: the drainer never blocks on it
	// Guarded by the shard's mutex.
	taken, abandoned bool
	// traced is the call as the tracer knows it, nil when its caller
	// records no span or the pipeline is not traced (pipeline_trace.go).
	traced TracedCall
}

// DefaultStoreTimeout bounds how long a decision waits for its turn, and
// then each of its transaction's round trips, unless configured: past it the
// failure policy applies. Every layer that waits on the store defaults to it.
const DefaultStoreTimeout = 3 * time.Second

// NewPipeline returns a Pipeline deciding through d.
func NewPipeline(d Decider, cfg *PipelineConfig) *Pipeline {
	var c PipelineConfig
	if cfg != nil {
		c = *cfg
	}
	if c.Timeout <= 0 {
		c.Timeout = DefaultStoreTimeout
	}
	if c.MaxBatch <= 0 {
		c.MaxBatch = 512
	}
	if c.MaxBatchBytes <= 0 {
		c.MaxBatchBytes = 1 << 20
	}
	if c.MaxQueue <= 0 {
		c.MaxQueue = 16384
	}
	if c.Shards <= 0 {
		c.Shards = 4
	}
	p := &Pipeline{decider: d, timeout: c.Timeout, gather: max(c.Gather, 0), maxBatch: c.MaxBatch, maxBytes: c.MaxBatchBytes, maxQueue: c.MaxQueue, tracer: c.Tracer}
	for range c.Shards {
		p.shards = append(p.shards, &shard{grown: make(chan struct{}, 1)})
	}
	return p
}

// Reserve is Store.Reserve through the pipeline.
func (p *Pipeline) Reserve(ctx context.Context, rp ReserveParams) (*Reservation, error) {
	r := p.do(ctx, Item{TenantID: rp.TenantID, Op: Op{Reserve: &rp}})
	return r.Reservation, r.Err
}

// Settle is Store.Settle through the pipeline.
func (p *Pipeline) Settle(ctx context.Context, sp SettleParams) (*Settlement, error) {
	r := p.do(ctx, Item{TenantID: sp.TenantID, Op: Op{Settle: &sp}})
	return r.Settlement, r.Err
}

// Release is Store.Release through the pipeline.
func (p *Pipeline) Release(ctx context.Context, rp ReleaseParams) (*Settlement, error) {
	r := p.do(ctx, Item{TenantID: rp.TenantID, Op: Op{Release: &rp}})
	return r.Settlement, r.Err
}

// Expire is Store.Expire through the pipeline: the expiry is decided in a
// batch with the tenant's other requests, under the same locks.
func (p *Pipeline) Expire(ctx context.Context, tenantID string) (int, error) {
	r := p.do(ctx, Item{TenantID: tenantID, Op: Op{Expire: &ExpireParams{TenantID: tenantID}}})
	return r.Expired, r.Err
}

// ErrQueueFull wraps ErrBusy when a shard's queue in this replica is full.
var ErrQueueFull = fmt.Errorf("%w: the replica's decision queue is full", rule.ErrBusy)

func (p *Pipeline) shardOf(tenantID string) *shard {
	h := fnv.New32a()
	_, _ = h.Write([]byte(tenantID))
	return p.shards[h.Sum32()%uint32(len(p.shards))]
}

// size estimates the bytes a request sends in its transaction: the ids
// and keys it names (an admission by id or by idempotency key, a tenant
// key, a gateway), and what a reserve writes.
func size(it Item) int {
	op := it.Op
	n := 160 + len(it.TenantID) + len(op.admissionID()) + len(op.admissionKey()) + len(op.keyID()) + len(op.gatewayID())
	if r := op.Reserve; r != nil {
		n += 120 + len(r.Estimate.Model) + len(r.Actor)
		if r.IdempotencyKey != "" {
			n += 900 + len(r.IdempotencyKey) + len(r.RequestHash) // the stored answer
		}
	}
	return n
}

// do queues an item and waits for its decision, or for its turn to run out.
func (p *Pipeline) do(ctx context.Context, it Item) OpResult {
	if err := ctx.Err(); err != nil {
		return OpResult{Err: err}
	}
	c := &pipeCall{item: it, bytes: size(it), done: make(chan struct{}, 1)}
	if err := p.wait(ctx, c, p.shardOf(it.TenantID)); err != nil {
		return OpResult{Err: err}
	}
	return c.result
}

// doAll queues items as one call, decided in one batch (ReserveAll), and
// waits for their decisions, or for their turn to run out.
func (p *Pipeline) doAll(ctx context.Context, items []Item) []OpResult {
	fail := func(err error) []OpResult {
		out := make([]OpResult, len(items))
		for i := range out {
			out[i].Err = err
		}
		return out
	}
	if len(items) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return fail(err)
	}
	c := &pipeCall{group: items, done: make(chan struct{}, 1)}
	for _, it := range items {
		c.bytes += size(it)
	}
	if err := p.wait(ctx, c, p.shardOf(lowestTenant(items))); err != nil {
		return fail(err)
	}
	return c.results
}

// wait queues c in sh and waits until it is decided (nil: the caller reads
// c.result or c.results), or its turn runs out, or ctx ends.
func (p *Pipeline) wait(ctx context.Context, c *pipeCall, sh *shard) error {
	if p.tracer != nil {
		c.traced = p.tracer.Call(ctx)
	}
	sh.mu.Lock()
	if len(sh.calls) >= p.maxQueue {
		sh.mu.Unlock()
		return ErrQueueFull
	}
	sh.calls = append(sh.calls, c)
	if sh.want > 0 && len(sh.calls) >= sh.want {
		sh.want = 0
		sh.grown <- struct{}{} // never blocks: one send per wait, and the drainer empties it
	}
	start := !sh.running
	sh.running = true
	sh.mu.Unlock()
	if start {
		go p.drain(sh)
	}

	queued := time.Now()
	timer := time.NewTimer(p.timeout)
	defer timer.Stop()
	timedOut := false
	select {
	case <-c.done:
		return nil
	case <-timer.C:
		timedOut = true
	case <-ctx.Done():
	}
	sh.mu.Lock()
	if c.taken {
		sh.mu.Unlock()
		<-c.done
		return nil // its transaction ran: its outcome is the ledger's
	}
	c.abandoned = true // before anything slow: no batch may take it now
	sh.mu.Unlock()
	if !timedOut {
		return ctx.Err()
	}
	err := fmt.Errorf("%w: waited its turn %s while earlier requests were being decided", rule.ErrBusy, p.timeout)
	if a, ok := p.decider.(answerer); ok && !a.Answering(ctx, queued) {
		// The batch ahead is stuck because the store hangs.
		err = fmt.Errorf("%w: %v", rule.ErrUnavailable, err)
	}
	return err
}

// drain decides the shard's queued requests, batch after batch, until the
// queue is empty.
func (p *Pipeline) drain(sh *shard) {
	var last int           // requests in the batch just decided
	var took time.Duration // and how long deciding them took
	for {
		if last >= GatherFrom && p.gather > 0 {
			p.gatherFor(sh, last, min(p.gather, took))
		}
		sh.mu.Lock()
		var batch []*pipeCall
		n, bytes := 0, 0
		for _, c := range sh.calls {
			if len(batch) == p.maxBatch || (len(batch) > 0 && bytes+c.bytes > p.maxBytes) {
				break
			}
			n++
			if c.abandoned {
				continue
			}
			c.taken = true
			batch = append(batch, c)
			bytes += c.bytes
		}
		sh.calls = sh.calls[n:]
		if len(batch) == 0 && len(sh.calls) == 0 {
			sh.running = false
			sh.calls = nil
			sh.mu.Unlock()
			return
		}
		sh.mu.Unlock()
		if len(batch) == 0 {
			continue
		}

		items := make([]Item, 0, len(batch))
		group := 0
		for _, c := range batch {
			if c.group == nil {
				items = append(items, c.item)
				continue
			}
			group++ // numbered within the batch
			for _, it := range c.group {
				it.Group = group
				items = append(items, it)
			}
		}
		began := time.Now()
		base := context.Background()
		var tx *txTrace
		if p.tracer != nil {
			base, tx = p.startTx(batch)
		}
		ctx, cancel := context.WithTimeout(base, p.timeout)
		results, err := p.decider.DecideBatch(ctx, items)
		cancel()
		last, took = len(batch), time.Since(began)
		if tx != nil {
			tx.end(batch, err)
		}
		i := 0
		for _, c := range batch {
			if c.group == nil {
				c.result = resultAt(results, i, err)
				i++
			} else {
				c.results = make([]OpResult, len(c.group))
				for j := range c.group {
					c.results[j] = resultAt(results, i, err)
					i++
				}
			}
			c.done <- struct{}{}
		}
	}
}

// resultAt is the decision on the i-th item of a batch decided with err.
func resultAt(results []OpResult, i int, err error) OpResult {
	switch {
	case err != nil:
		return OpResult{Err: err}
	case i < len(results):
		return results[i]
	}
	return OpResult{Err: errors.New("budget: the decider returned too few results")}
}

// gatherFor waits, at most wait, until the shard's queue holds answered
// more requests than it does now (at most a full batch): the callers of the
// batch just answered coming back. Why: a transaction's cost is mostly
// fixed (its statements, round trips and commit are the same for 2
// requests or 30), so when callers wait on their answers, deciding them
// all in the next transaction instead of half in each costs Postgres and
// this process about a quarter less CPU per request, and decides more
// requests a second (BENCHMARKS.md, issue 23). No lock is held while it
// waits.
func (p *Pipeline) gatherFor(sh *shard, answered int, wait time.Duration) {
	sh.mu.Lock()
	want := min(len(sh.calls)+answered, p.maxBatch)
	if wait <= 0 || len(sh.calls) >= want {
		sh.mu.Unlock()
		return
	}
	sh.want = want
	sh.mu.Unlock()
	t := time.NewTimer(wait)
	select {
	case <-sh.grown:
	case <-t.C:
	}
	t.Stop()
	sh.mu.Lock()
	sh.want = 0
	select { // a call that reached want as the timer fired
	case <-sh.grown:
	default:
	}
	sh.mu.Unlock()
}
