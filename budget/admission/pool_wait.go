package admission

import (
	"sync"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
)

// poolQueues holds, per upstream pool, the callers of this replica waiting
// for it (max_wait_ms), in the order they are to be served: priority class
// (critical, standard, sheddable), then their tenant's virtual token
// counter, lowest first (the tenant served least for its weight), then
// arrival. A decision for anyone must leave in the pool what the callers
// ordered before it need, so the pool's capacity goes to the tenants in
// weighted fair shares when it is short, and no tenant with waiting work
// is starved: each admission raises its tenant's counter until another is
// lowest.
//
// The counters live in Postgres, updated by the decision that serves the
// tokens, and every decision reports them back: every replica orders its
// callers by the same counters. What it learns (which pool a model draws
// on, the class of a key, the counters) comes from the decisions it made.
type poolQueues struct {
	mu       sync.Mutex
	pools    map[string]*poolWaiters
	vtc      map[string]map[string]int64 // pool -> tenant -> counter
	routes   map[string]string           // model key -> pool
	priority map[string]rule.Priority    // key id -> class
	seq      uint64
}

type poolWaiters struct {
	queue []*poolWaiter
	wake  chan struct{}
}

type poolWaiter struct {
	tenant    string
	rank      int
	needMicro int64
	seq       uint64
}

func newPoolQueues() *poolQueues {
	return &poolQueues{pools: map[string]*poolWaiters{}, vtc: map[string]map[string]int64{},
		routes: map[string]string{}, priority: map[string]rule.Priority{}}
}

// learn keeps what a decision reported of a pool and a key.
func (q *poolQueues) learn(p account.ReserveParams, pool *rule.PoolState, pr rule.Priority) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if pr != "" && p.KeyID != "" {
		q.priority[p.KeyID] = pr
	}
	if pool != nil {
		q.routes[account.ModelKey(p.Estimate)] = pool.ID
		q.vtc[pool.ID] = pool.VTC
	}
}

// poolOf is the pool a request's model draws on, as far as this replica
// knows ("" before any decision of the model said).
func (q *poolQueues) poolOf(p account.ReserveParams) string {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.routes[account.ModelKey(p.Estimate)]
}

func (q *poolQueues) of(pool string) *poolWaiters {
	pw, ok := q.pools[pool]
	if !ok {
		pw = &poolWaiters{wake: make(chan struct{})}
		q.pools[pool] = pw
	}
	return pw
}

// less orders two callers of a pool. The caller holds mu.
func (q *poolQueues) less(pool string, a, b *poolWaiter) bool {
	if a.rank != b.rank {
		return a.rank < b.rank
	}
	va, vb := q.vtc[pool][a.tenant], q.vtc[pool][b.tenant]
	if va != vb {
		return va < vb
	}
	return a.seq < b.seq
}

// probe is a caller not yet waiting: it would come after every caller of
// its class and counter that waits already.
func (q *poolQueues) probe(p account.ReserveParams) *poolWaiter {
	q.mu.Lock()
	defer q.mu.Unlock()
	return &poolWaiter{tenant: p.TenantID, rank: q.priority[p.KeyID].Rank(), needMicro: (p.Estimate.InputTokens + p.Estimate.OutputTokens) * rule.Micro, seq: ^uint64(0)}
}

// ahead is what the callers of pool to be served before me need.
func (q *poolQueues) ahead(pool string, me *poolWaiter) int64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	pw, ok := q.pools[pool]
	if !ok {
		return 0
	}
	var sum int64
	for _, o := range pw.queue {
		if o != me && q.less(pool, o, me) {
			sum += o.needMicro
		}
	}
	return sum
}

// waiting reports whether some caller of tenant waits for pool here: the
// tenant is backlogged, not returning from idle.
func (q *poolQueues) waiting(pool, tenant string) bool {
	if pool == "" {
		return false
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if pw, ok := q.pools[pool]; ok {
		for _, o := range pw.queue {
			if o.tenant == tenant {
				return true
			}
		}
	}
	return false
}

// enter queues a caller for pool, or refuses when the pool's queue in
// this replica is full.
func (q *poolQueues) enter(pool string, me *poolWaiter, max int) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	pw := q.of(pool)
	if len(pw.queue) >= max {
		return false
	}
	q.seq++
	me.seq = q.seq
	pw.queue = append(pw.queue, me)
	return true
}

// leave takes a caller out and wakes the others: what it held back is free.
func (q *poolQueues) leave(pool string, me *poolWaiter) {
	q.mu.Lock()
	defer q.mu.Unlock()
	pw, ok := q.pools[pool]
	if !ok {
		return
	}
	for i, o := range pw.queue {
		if o == me {
			pw.queue = append(pw.queue[:i], pw.queue[i+1:]...)
			break
		}
	}
	close(pw.wake)
	pw.wake = make(chan struct{})
	if len(pw.queue) == 0 {
		delete(q.pools, pool)
	}
}

// wakeup returns a channel closed at the pool's next wake (nil for "").
func (q *poolQueues) wakeup(pool string) <-chan struct{} {
	if pool == "" {
		return nil
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.of(pool).wake
}

// wake wakes the pool's callers: an admission that drew on it ended here.
func (q *poolQueues) wake(pool string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if pw, ok := q.pools[pool]; ok {
		close(pw.wake)
		pw.wake = make(chan struct{})
	}
}
