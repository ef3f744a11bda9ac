package api

import (
	"context"
	"crypto/sha256"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/labstack/echo/v5"

	"github.com/tokengate/tokengate/budget"
	"github.com/tokengate/tokengate/estimator"
)

// storeState tracks whether this replica can reach the store. After a
// decision fails for an outage, requests stop trying the store (each try
// would wait for a timeout) until the recovery loop reaches it again.
type storeState struct {
	down  atomic.Bool
	since atomic.Int64 // unix nanoseconds of the first failure

	// What this replica last knew, for deciding without the store: the
	// tenants its keys belong to, and each tenant's last snapshot.
	authMu sync.Mutex
	auth   map[[32]byte]cachedAuth
	known  map[string]knownKey // key ids this replica looked up, with their stored secret hash
	snaps  sync.Map            // tenant id -> budget.Snapshot

	// replayErr is the last spool replay's failure, nil once one succeeds:
	// /readyz fails while decisions made without the store are not in it.
	replayErr atomic.Pointer[string]
}

type cachedAuth struct {
	tenantID, keyID string
	at              time.Time
}

// authCacheTTL bounds how old a key's last successful check may be for the
// key to be accepted while the store is unreachable. Revocations made during
// an outage cannot be seen until it ends.
const authCacheTTL = 24 * time.Hour

func (s *Server) markDown(err error) {
	if s.store.down.CompareAndSwap(false, true) {
		s.store.since.Store(time.Now().UnixNano())
		s.logger.Error("store unavailable: deciding by the failure policy until it is back", "error", err.Error())
		s.admissions.storeUp.Set(0)
		// The pool's connections are likely dead too; drop them so none is
		// handed out once the store is back.
		s.db.Reset()
	}
}

func (s *Server) storeDown() bool { return s.store.down.Load() }

func (s *Server) rememberAuth(key, tenantID, keyID string) {
	h := sha256.Sum256([]byte(key))
	s.store.authMu.Lock()
	defer s.store.authMu.Unlock()
	if s.store.auth == nil || len(s.store.auth) > 100_000 {
		s.store.auth = map[[32]byte]cachedAuth{}
	}
	s.store.auth[h] = cachedAuth{tenantID: tenantID, keyID: keyID, at: time.Now()}
}

type knownKey struct {
	secretHash []byte
	at         time.Time
}

// rememberKey records that a key with this id exists, and its stored
// secret hash, for the failed-authentication limiter.
func (s *Server) rememberKey(id string, secretHash []byte) {
	s.store.authMu.Lock()
	defer s.store.authMu.Unlock()
	if s.store.known == nil || len(s.store.known) > 100_000 {
		s.store.known = map[string]knownKey{}
	}
	s.store.known[id] = knownKey{secretHash: secretHash, at: time.Now()}
}

// knownKey returns the stored secret hash of a key id this replica looked
// up within authCacheTTL.
func (s *Server) knownKey(id string) ([]byte, bool) {
	s.store.authMu.Lock()
	defer s.store.authMu.Unlock()
	k, ok := s.store.known[id]
	if !ok || time.Since(k.at) > authCacheTTL {
		return nil, false
	}
	return k.secretHash, true
}

func (s *Server) cachedAuth(key string) (cachedAuth, bool) {
	h := sha256.Sum256([]byte(key))
	s.store.authMu.Lock()
	defer s.store.authMu.Unlock()
	a, ok := s.store.auth[h]
	if !ok || time.Since(a.at) > authCacheTTL {
		return cachedAuth{}, false
	}
	return a, true
}

func (s *Server) rememberSnapshot(snap budget.Snapshot) {
	if snap.TenantID != "" {
		s.store.snaps.Store(snap.TenantID, snap)
	}
}

func (s *Server) lastSnapshot(tenantID string) (budget.Snapshot, bool) {
	v, ok := s.store.snaps.Load(tenantID)
	if !ok {
		return budget.Snapshot{}, false
	}
	return v.(budget.Snapshot), true
}

// policyFor resolves the failure policy of a request: the model's, else the
// tenant's, else the server's default.
func (s *Server) policyFor(est estimator.Estimate, tenantID string) budget.Policy {
	if p := budget.Policy(est.OnStoreUnavailable); p != budget.PolicyDefault {
		return p
	}
	if snap, ok := s.lastSnapshot(tenantID); ok && snap.Limits.OnStoreUnavailable != budget.PolicyDefault {
		return snap.Limits.OnStoreUnavailable
	}
	if s.cfg.OnStoreUnavailable != budget.PolicyDefault {
		return s.cfg.OnStoreUnavailable
	}
	return budget.PolicyReject
}

// storeContext bounds a call to the store, so that an outage that hangs
// connections (a paused host, a black-holed network) answers in time.
func (s *Server) storeContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.cfg.StoreTimeout)
}

// decide reserves through the store, or, when the store is unreachable and
// the request's policy is local, against this replica's share.
func (s *Server) decide(ctx context.Context, p budget.ReserveParams, maxWait time.Duration) (*budget.Reservation, bool, error) {
	var err error
	if !s.storeDown() {
		var r *budget.Reservation
		r, err = s.reserveWaiting(ctx, p, maxWait)
		if err == nil {
			s.rememberSnapshot(r.Snapshot)
			return r, false, nil
		}
		var rej *budget.RejectedError
		if errors.As(err, &rej) {
			s.rememberSnapshot(rej.Snapshot)
		}
		if !errors.Is(err, budget.ErrUnavailable) || errors.Is(err, budget.ErrOutcomeUnknown) {
			return nil, false, err
		}
		s.markDown(err)
	} else {
		err = budget.ErrUnavailable
	}
	if s.policyFor(p.Estimate, p.TenantID) != budget.PolicyLocal || s.cfg.Local == nil {
		return nil, false, err
	}
	snap, ok := s.lastSnapshot(p.TenantID)
	if !ok {
		return nil, false, err // this replica never saw the tenant: it has no limits to apply
	}
	r, lerr := s.cfg.Local.Reserve(snap, p)
	return r, true, lerr
}

// RunRecovery checks the store every interval while it is marked down or
// the spool holds decisions made without it; once the store answers, it
// replays the spool and lets requests use the store again. Every replica
// runs it.
func (s *Server) RunRecovery(ctx context.Context, interval time.Duration) {
	if interval <= 0 {
		interval = 500 * time.Millisecond
	}
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		pending := false
		if s.cfg.Local != nil {
			if n, err := s.cfg.Local.Spool.Len(); err == nil && n > 0 {
				pending = true
			}
		}
		if !s.storeDown() && !pending {
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		err := s.db.Ping(pctx)
		cancel()
		if err != nil {
			continue
		}
		if pending {
			rctx, cancel := context.WithTimeout(ctx, time.Minute)
			rep, err := s.cfg.Local.Replay(rctx, s.budget)
			cancel()
			if err != nil {
				msg := err.Error()
				s.store.replayErr.Store(&msg)
				s.admissions.replayFail.Inc()
				s.logger.Error("replaying decisions made during the outage failed; retrying", "error", msg, "applied", rep.Reserved+rep.Ended,
					"spool", s.cfg.Local.Spool.Path())
				continue
			}
			s.store.replayErr.Store(nil)
			s.logger.Info("replayed decisions made during the outage", "records", rep.Records, "admissions", rep.Reserved,
				"settles_and_releases", rep.Ended, "already_applied", rep.Skipped, "rejected", rep.Rejected)
		}
		if s.store.down.CompareAndSwap(true, false) {
			s.logger.Info("store reachable again", "down_for", time.Since(time.Unix(0, s.store.since.Load())).Round(time.Millisecond).String())
			s.admissions.storeUp.Set(1)
		}
	}
}

// endDuringOutage journals a settle or release for the recovery loop to
// apply, answering 202: the accounting is kept, the balance is not known yet.
func (s *Server) endDuringOutage(c *echo.Context, settle bool, body []byte) error {
	if s.cfg.Local == nil {
		return budget.ErrUnavailable
	}
	var in, out int64
	if settle {
		var err error
		if in, out, err = parseUsage(body); err != nil {
			return err
		}
	}
	if err := s.cfg.Local.End(tenantOf(c), c.Param("id"), settle, in, out, "key:"+keyOf(c)); err != nil {
		return err
	}
	return c.JSON(http.StatusAccepted, map[string]string{
		"id": c.Param("id"), "state": "pending",
		"message": "the store is unreachable; this settle is journaled and applied when it is back",
	})
}
