package lease

import (
	"context"
	_ "embed"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

var (
	//go:embed sql/mode_auto.sql
	modeAutoSQL string
	//go:embed sql/lease_holders.sql
	leaseHoldersSQL string
)

// ModeRefresh is how stale a replica's copy of the lease modes may get: a
// mode set through another replica applies here within it, one set
// through this replica's Store at once. The copy is one query for every
// tenant, so the admission path asks the store nothing per admission.
var ModeRefresh = 2 * time.Second

// modeCache is a replica's copy of the tenants in mode auto.
type modeCache struct {
	copy       atomic.Pointer[modeCopy]
	refreshing atomic.Bool
	loading    sync.Mutex
}

type modeCopy struct {
	at   time.Time
	auto map[string]bool
}

// Auto reports whether a tenant's lease mode is auto, from this replica's
// copy of the modes (read again when older than ModeRefresh, by one
// caller while the others use the copy they have; at once after SetMode
// through this Store). With no copy, callers wait for one read, and its
// failure is their error (the caller then decides exactly).
func (s *Store) Auto(ctx context.Context, tenantID string) (bool, error) {
	c := s.modes.copy.Load()
	switch {
	case c == nil:
		s.modes.loading.Lock()
		defer s.modes.loading.Unlock()
		if c = s.modes.copy.Load(); c == nil {
			var err error
			if c, err = s.loadModes(ctx); err != nil {
				return false, err
			}
		}
	case time.Since(c.at) > ModeRefresh && s.modes.refreshing.CompareAndSwap(false, true):
		if fresh, err := s.loadModes(ctx); err == nil {
			c = fresh
		}
		s.modes.refreshing.Store(false)
	}
	return c.auto[tenantID], nil
}

// dropModes forgets the copy: the next Auto reads the modes again.
func (s *Store) dropModes() { s.modes.copy.Store(nil) }

func (s *Store) loadModes(ctx context.Context) (*modeCopy, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	at := time.Now()
	rows, err := s.acct.Pool().Query(ctx, modeAutoSQL)
	if err != nil {
		return nil, fmt.Errorf("lease: modes: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("lease: modes: %w", err)
	}
	c := &modeCopy{at: at, auto: make(map[string]bool, len(ids))}
	for _, id := range ids {
		c.auto[id] = true
	}
	s.modes.copy.Store(c)
	return c, nil
}

// Holders is how many live, unexpired leases the tenant has: the
// replicas holding it, which share its capacity (the slice's cap).
func (s *Store) Holders(ctx context.Context, tenantID string) (int, error) {
	var n int
	if err := s.acct.Pool().QueryRow(ctx, leaseHoldersSQL, tenantID, s.frozen()).Scan(&n); err != nil {
		return 0, fmt.Errorf("lease: holders of %s: %w", tenantID, err)
	}
	return n, nil
}

// TTL is the leases' time to live.
func (s *Store) TTL() time.Duration { return s.ttl }
