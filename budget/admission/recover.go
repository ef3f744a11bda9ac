package admission

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// SweepOnce expires every overdue reservation, each tenant's expiry decided
// through the pipeline with that tenant's other requests. While the store
// is down it does nothing: expiry can wait for the store.
func (a *Admitter) SweepOnce(ctx context.Context) (int, error) {
	if a.Down() {
		return 0, nil
	}
	if a.tracer != nil {
		return a.cfg.Store.SweepOnce(ctx, a.expireTraced)
	}
	return a.cfg.Store.SweepOnce(ctx, a.pipeline.Expire)
}

// Ready reports why this replica should not get traffic: nil when its
// spool of decisions made without the store is replayed (or empty).
func (a *Admitter) Ready() error {
	if msg := a.replayErr.Load(); msg != nil {
		return fmt.Errorf("decisions made during the store outage could not be replayed yet: %s", *msg)
	}
	return nil
}

// RecoverOnce is one turn of the recovery loop, which every replica runs
// (every 500 ms): while the store is marked down or the spool holds
// decisions made without it, it pings the store; once the store answers,
// it replays the spool and lets requests use the store again.
func (a *Admitter) RecoverOnce(ctx context.Context) {
	pending := false
	if a.cfg.Local != nil {
		if n, err := a.cfg.Local.Spool.Len(); err == nil && n > 0 {
			pending = true
		}
	}
	if !a.Down() && !pending {
		return
	}
	if a.cfg.Pool != nil {
		pctx, cancel := context.WithTimeout(ctx, recoveryPingTimeout(a.cfg.Pool))
		err := a.cfg.Pool.Ping(pctx)
		cancel()
		if err != nil {
			return
		}
	}
	if pending {
		rctx, cancel := context.WithTimeout(ctx, time.Minute)
		rep, err := a.cfg.Local.Replay(rctx, a.cfg.Store)
		cancel()
		if err != nil {
			msg := err.Error()
			a.replayErr.Store(&msg)
			a.replayFail.Inc()
			a.logger.Error("replaying decisions made during the outage failed; retrying", "error", msg, "applied", rep.Reserved+rep.Ended,
				"spool", a.cfg.Local.Spool.Path())
			return
		}
		a.replayErr.Store(nil)
		a.logger.Info("replayed decisions made during the outage", "records", rep.Records, "admissions", rep.Reserved,
			"settles_and_releases", rep.Ended, "kept_for_another_replay", rep.Deferred, "already_applied", rep.Skipped, "rejected", rep.Rejected)
	}
	if a.down.CompareAndSwap(true, false) {
		a.logger.Info("store reachable again", "down_for", time.Since(time.Unix(0, a.since.Load())).Round(time.Millisecond).String())
		a.storeUp.Set(1)
	}
}

// recoveryPingTimeout bounds the recovery loop's ping: a second, plus a
// connect timeout for each host of a multi-host URL. After a failover the
// first hosts may be a killed primary, which costs a whole connect timeout
// before the next host is tried: a one-second ping would never reach the
// new primary behind it.
func recoveryPingTimeout(pool *pgxpool.Pool) time.Duration {
	cfg := pool.Config().ConnConfig
	return time.Second + cfg.ConnectTimeout*time.Duration(1+len(cfg.Fallbacks))
}
