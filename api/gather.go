package api

import (
	"context"
	"sync"
	"time"

	"github.com/tokengate/tokengate/budget"
)

// maxBatch bounds how many requests of one tenant one transaction decides.
const maxBatch = 128

// gather decides the concurrent admissions of one tenant together. A
// tenant's row takes about 1 / (lock hold time) transactions a second, so
// instead of each request queueing on the row lock in Postgres, requests
// queue here while the tenant's current transaction runs, and the next
// transaction decides all of them under one lock and one commit
// (budget.ReserveBatch), in arrival order. Under light load a batch is one
// request and nothing is waited for; under load, throughput grows with the
// batch instead of being capped by the commit rate. Each replica keeps one
// transaction per tenant in flight.
type gather struct {
	store   Budget
	timeout time.Duration

	mu     sync.Mutex
	queues map[string][]*gatherCall // a tenant present here has a drainer running
}

type gatherCall struct {
	ctx  context.Context
	p    budget.ReserveParams
	done chan gatherResult
}

type gatherResult struct {
	r   *budget.Reservation
	err error
}

func newGather(store Budget, timeout time.Duration) *gather {
	return &gather{store: store, timeout: timeout, queues: map[string][]*gatherCall{}}
}

// reserve queues p and waits for its decision. It waits even if ctx ends
// meanwhile: once a request is in a batch its transaction may commit, and
// its caller must hear the answer the ledger will hold (the store timeout
// bounds the wait). A request whose ctx ended before its batch began is
// dropped undecided.
func (g *gather) reserve(ctx context.Context, p budget.ReserveParams) (*budget.Reservation, error) {
	c := &gatherCall{ctx: ctx, p: p, done: make(chan gatherResult, 1)}
	g.mu.Lock()
	q, running := g.queues[p.TenantID]
	g.queues[p.TenantID] = append(q, c)
	g.mu.Unlock()
	if !running {
		go g.drain(p.TenantID)
	}
	res := <-c.done
	return res.r, res.err
}

// drain decides the tenant's queued requests, batch after batch, until the
// queue is empty.
func (g *gather) drain(tenantID string) {
	for {
		g.mu.Lock()
		q := g.queues[tenantID]
		if len(q) == 0 {
			delete(g.queues, tenantID)
			g.mu.Unlock()
			return
		}
		n := min(len(q), maxBatch)
		batch := q[:n:n]
		g.queues[tenantID] = q[n:]
		g.mu.Unlock()

		live := batch[:0:0]
		for _, c := range batch {
			if err := c.ctx.Err(); err != nil {
				c.done <- gatherResult{err: err}
				continue
			}
			live = append(live, c)
		}
		if len(live) == 0 {
			continue
		}
		ps := make([]budget.ReserveParams, len(live))
		for i, c := range live {
			ps[i] = c.p
		}
		ctx, cancel := context.WithTimeout(context.Background(), g.timeout)
		results, err := g.store.ReserveBatch(ctx, tenantID, ps)
		cancel()
		for i, c := range live {
			if err != nil {
				c.done <- gatherResult{err: err}
				continue
			}
			c.done <- gatherResult{r: results[i].Reservation, err: results[i].Err}
		}
	}
}
