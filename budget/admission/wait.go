package admission

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
)

// waitQueues holds, per tenant, the callers of this replica waiting for
// tokens (max_wait_ms), first in, first out: each needs its cost, and a
// decision for anyone behind them must leave what they need in the bucket.
// So a large request waiting for refill is served before smaller ones that
// arrive after it, instead of being starved by them. The queue is bounded
// per tenant; a reservation ending here, or a waiter leaving, wakes the
// tenant's waiters.
type waitQueues struct {
	mu      sync.Mutex
	max     int
	gauge   prometheus.Gauge // callers waiting now, in every tenant
	tenants map[string]*tenantWaiters
}

type tenantWaiters struct {
	queue []*waiter
	wake  chan struct{}
	root  string // the root of the tenant's budget tree, as its refusals showed it
}

type waiter struct{ needMicro int64 }

func newWaitQueues(max int, reg prometheus.Registerer) *waitQueues {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "tokengate_waiting_callers",
		Help: "Callers of this replica waiting for tokens (max_wait_ms) right now.",
	})
	reg.MustRegister(g)
	return &waitQueues{max: max, gauge: g, tenants: map[string]*tenantWaiters{}}
}

func (w *waitQueues) of(tenantID string) *tenantWaiters {
	tw, ok := w.tenants[tenantID]
	if !ok {
		tw = &tenantWaiters{wake: make(chan struct{})}
		w.tenants[tenantID] = tw
	}
	return tw
}

// ahead is what the callers queued before me need (all of them for a
// caller not queued: it comes after everyone waiting).
func (w *waitQueues) ahead(tenantID string, me *waiter) int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	tw, ok := w.tenants[tenantID]
	if !ok {
		return 0
	}
	var sum int64
	for _, q := range tw.queue {
		if q == me {
			break
		}
		sum += q.needMicro
	}
	return sum
}

// enter queues a caller needing needMicro, or refuses when the tenant's
// queue is full. root is the tenant's budget tree ("" for none).
func (w *waitQueues) enter(tenantID string, needMicro int64, root string) (*waiter, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	tw := w.of(tenantID)
	tw.root = root
	if len(tw.queue) >= w.max {
		return nil, false
	}
	me := &waiter{needMicro: needMicro}
	tw.queue = append(tw.queue, me)
	w.gauge.Inc()
	return me, true
}

// leave takes a caller out of the queue (admitted, or given up) and wakes
// the others: what it held back is free for them.
func (w *waitQueues) leave(tenantID string, me *waiter) {
	w.mu.Lock()
	defer w.mu.Unlock()
	tw, ok := w.tenants[tenantID]
	if !ok {
		return
	}
	for i, q := range tw.queue {
		if q == me {
			tw.queue = append(tw.queue[:i], tw.queue[i+1:]...)
			w.gauge.Dec()
			break
		}
	}
	close(tw.wake)
	tw.wake = make(chan struct{})
	if len(tw.queue) == 0 {
		delete(w.tenants, tenantID)
	}
}

// wakeup returns a channel closed at the tenant's next wake.
func (w *waitQueues) wakeup(tenantID string) <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.of(tenantID).wake
}

// inTree lists the tenants with callers waiting in the budget tree under
// root.
func (w *waitQueues) inTree(root string) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for id, tw := range w.tenants {
		if tw.root == root && len(tw.queue) > 0 {
			out = append(out, id)
		}
	}
	return out
}

// wake wakes the tenant's waiters: a reservation ended here.
func (w *waitQueues) wake(tenantID string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if tw, ok := w.tenants[tenantID]; ok {
		close(tw.wake)
		tw.wake = make(chan struct{})
	}
}

// holdBack sets what p's decision must leave for the callers this replica
// holds waiting ahead of it: in its tenant's bucket (me is its place among
// them, nil for none) and in its model's pool (mine its place among the
// pool's waiters, in myPool). pool is the model's (poolQueues.poolOf).
func (a *Admitter) holdBack(p *account.ReserveParams, pool string, me *waiter, mine *poolWaiter, myPool string) {
	p.HoldbackMicro = a.waiters.ahead(p.TenantID, me)
	// Backlogged: waiting already, or another caller of the tenant is,
	// or this replica cannot tell (it has not learnt the model's pool).
	p.PoolHoldbackMicro, p.PoolBacklogged = 0, mine != nil || pool == "" || a.pools.waiting(pool, p.TenantID)
	if pool != "" {
		at := mine
		if at == nil || myPool != pool {
			at = a.pools.probe(*p)
		}
		p.PoolHoldbackMicro = a.pools.ahead(pool, at)
	}
}

// reserveWaiting reserves, and when a limit refuses and the caller asked to
// wait, waits for exactly the time the limit needs and tries again. The wait
// is capped by the caller's max_wait and the tenant's max_wait limit; the
// number of waiters per tenant is bounded; waiting ends when the caller
// disconnects (ctx) or its wait runs out, and the last rejection is then
// returned. Waiting holds no lock and no connection.
func (a *Admitter) reserveWaiting(ctx context.Context, p account.ReserveParams, maxWait time.Duration) (*account.Reservation, error) {
	start := time.Now()
	var me *waiter
	var mine *poolWaiter // my place among the pool's waiters, once I wait for it
	var myPool string
	var waited time.Duration // paused for tokens, in waits pauses
	var paused time.Time     // when the pause under way began
	waits := 0
	defer func() {
		if !paused.IsZero() {
			waited += time.Since(paused)
		}
		if waits > 0 && a.tracer != nil {
			noteWaited(ctx, waited, waits)
		}
		if me != nil {
			a.waiters.leave(p.TenantID, me)
		}
		if mine != nil {
			a.pools.leave(myPool, mine)
		}
	}()
	for {
		var wake, poolWake <-chan struct{}
		pool := a.pools.poolOf(p)
		if maxWait > 0 {
			wake = a.waiters.wakeup(p.TenantID) // before deciding, so no wake is missed
			poolWake = a.pools.wakeup(pool)
		}
		a.holdBack(&p, pool, me, mine, myPool)
		r, err := a.pipeline.Reserve(ctx, p)
		var rej *rule.RejectedError
		switch {
		case err == nil:
			a.pools.learn(p, r.Pool, r.Priority)
		case errors.As(err, &rej):
			a.pools.learn(p, rej.PoolState, rej.Priority)
		}
		if maxWait <= 0 || rej == nil {
			return r, err
		}
		limit := min(maxWait, rej.Snapshot.Limits.MaxWait)
		left := limit - time.Since(start)
		pause := rej.RetryAfter
		if rej.Limit == rule.LimitConcurrency {
			pause = min(pause, left) // a hint: a slot may free any time
		}
		if left <= 0 || pause > left && rej.Limit != rule.LimitPool {
			return nil, err
		}
		if rej.Limit == rule.LimitPool {
			// The pool refills for everyone: what it holds back for the
			// callers ahead may go to me sooner than my own refill time
			// says, and a pool that is short wakes its waiters as they
			// are served or end.
			pause = min(pause, left)
			if mine == nil || myPool != rej.Pool {
				if mine != nil {
					a.pools.leave(myPool, mine)
				}
				myPool, mine = rej.Pool, a.pools.probe(p)
				if !a.pools.enter(myPool, mine, a.cfg.MaxWaiters) {
					mine = nil
					return nil, err
				}
				poolWake = a.pools.wakeup(myPool)
			}
		} else if me == nil {
			var ok bool
			// The refusing level is in the caller's tree, so its root is the
			// caller's: a reservation ending anywhere in the tree wakes it.
			root := rej.Snapshot.TenantID
			if len(rej.Snapshot.Path) > 0 {
				root = rej.Snapshot.Path[0]
			}
			if me, ok = a.waiters.enter(p.TenantID, p.Estimate.Cost*rule.Micro, root); !ok {
				return nil, err
			}
		}
		a.testSignals.paused.signal(p.TenantID)
		timer := time.NewTimer(pause)
		paused = time.Now()
		waits++
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil, err
		case <-a.stopping:
			timer.Stop()
			return nil, err
		case <-wake:
			timer.Stop()
		case <-poolWake:
			timer.Stop()
		case <-timer.C:
		}
		waited += time.Since(paused)
		paused = time.Time{}
	}
}
