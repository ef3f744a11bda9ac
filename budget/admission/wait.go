package admission

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokengate/tokengate/budget"
)

// waitQueues bounds how many callers of one tenant may wait for tokens at
// once in this replica, and wakes waiters for a concurrency slot when a
// reservation of that tenant ends here.
type waitQueues struct {
	mu      sync.Mutex
	max     int
	gauge   prometheus.Gauge // callers waiting now, in every tenant
	waiting map[string]int
	wakeups map[string]chan struct{}
}

func newWaitQueues(max int, reg prometheus.Registerer) *waitQueues {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "tokengate_waiting_callers",
		Help: "Callers of this replica waiting for tokens (max_wait_ms) right now.",
	})
	reg.MustRegister(g)
	return &waitQueues{max: max, gauge: g, waiting: map[string]int{}, wakeups: map[string]chan struct{}{}}
}

func (w *waitQueues) enter(tenantID string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.waiting[tenantID] >= w.max {
		return false
	}
	w.waiting[tenantID]++
	w.gauge.Inc()
	return true
}

func (w *waitQueues) leave(tenantID string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.gauge.Dec()
	if w.waiting[tenantID]--; w.waiting[tenantID] <= 0 {
		delete(w.waiting, tenantID)
		delete(w.wakeups, tenantID)
	}
}

// wakeup returns a channel closed at the tenant's next wake.
func (w *waitQueues) wakeup(tenantID string) <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	ch, ok := w.wakeups[tenantID]
	if !ok {
		ch = make(chan struct{})
		w.wakeups[tenantID] = ch
	}
	return ch
}

func (w *waitQueues) wake(tenantID string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if ch, ok := w.wakeups[tenantID]; ok {
		close(ch)
		delete(w.wakeups, tenantID)
	}
}

// reserveWaiting reserves, and when a limit refuses and the caller asked to
// wait, waits for exactly the time the limit needs and tries again. The wait
// is capped by the caller's max_wait and the tenant's max_wait limit; the
// number of waiters per tenant is bounded; waiting ends when the caller
// disconnects (ctx) or its wait runs out, and the last rejection is then
// returned. Waiting holds no lock and no connection.
func (a *Admitter) reserveWaiting(ctx context.Context, p budget.ReserveParams, maxWait time.Duration) (*budget.Reservation, error) {
	start := time.Now()
	entered := false
	defer func() {
		if entered {
			a.waiters.leave(p.TenantID)
		}
	}()
	for {
		var wake <-chan struct{}
		if maxWait > 0 {
			wake = a.waiters.wakeup(p.TenantID) // before deciding, so no wake is missed
		}
		r, err := a.pipeline.Reserve(ctx, p)
		var rej *budget.RejectedError
		if maxWait <= 0 || !errors.As(err, &rej) {
			return r, err
		}
		limit := min(maxWait, rej.Snapshot.Limits.MaxWait)
		left := limit - time.Since(start)
		pause := rej.RetryAfter
		if rej.Limit == budget.LimitConcurrency {
			pause = min(pause, left) // a hint: a slot may free any time
		}
		if left <= 0 || pause > left {
			return nil, err
		}
		if !entered {
			if !a.waiters.enter(p.TenantID) {
				return nil, err
			}
			entered = true
		}
		timer := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil, err
		case <-a.stopping:
			timer.Stop()
			return nil, err
		case <-wake:
			timer.Stop()
		case <-timer.C:
		}
	}
}
