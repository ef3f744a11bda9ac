package account

import (
	"context"
	_ "embed"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// policyCopy is a replica's copy of every end-user policy, by tenant, as
// read at one time.
type policyCopy struct {
	at       time.Time
	byTenant map[string]*EndUserPolicy
}

// EndUserPolicyOf returns a tenant's end-user policy (nil for none) from
// this replica's copy, refreshed when older than EndUserPolicyRefresh, and
// at once after a policy write through this store. A tenant without a
// policy costs a map lookup: the refresh is one query for every tenant,
// made by one caller while the others read the copy they have (a failed
// refresh keeps it). With no copy at all, callers wait for one read, and
// its failure is their error.
func (s *Store) EndUserPolicyOf(ctx context.Context, tenantID string) (*EndUserPolicy, error) {
	c := s.endUserPolicies.Load()
	switch {
	case c == nil:
		// No copy (the first read, or a write through this store): every
		// caller waits for the one read, so that none decides as if the
		// tenant had no policy.
		s.endUserLoading.Lock()
		defer s.endUserLoading.Unlock()
		if c = s.endUserPolicies.Load(); c == nil {
			// The callers queued behind a failed read share its failure
			// for a second rather than each wait for one of their own.
			if f := s.endUserFailed; f != nil && time.Since(f.at) < time.Second {
				return nil, f.err
			}
			var err error
			if c, err = s.loadPolicies(ctx); err != nil {
				s.endUserFailed = &failedRead{at: time.Now(), err: err}
				return nil, err
			}
			s.endUserFailed = nil
		}
	case time.Since(c.at) > EndUserPolicyRefresh && s.endUserRefreshing.CompareAndSwap(false, true):
		// Stale: one caller reads a new copy, the others use this one.
		if fresh, err := s.loadPolicies(ctx); err == nil {
			c = fresh
		}
		s.endUserRefreshing.Store(false)
	}
	return c.byTenant[tenantID], nil
}

// loadPolicies reads every policy into a new copy, within
// DefaultStoreTimeout (a replica whose store went away learns it from its
// decisions, not from here).
func (s *Store) loadPolicies(ctx context.Context) (*policyCopy, error) {
	ctx, cancel := context.WithTimeout(ctx, DefaultStoreTimeout)
	defer cancel()
	at := time.Now()
	rows, err := s.pool.Query(ctx, endUserPolicyAllSQL)
	if err != nil {
		return nil, classify(fmt.Errorf("budget: end-user policies: %w", err), false, false)
	}
	rs, err := pgx.CollectRows(rows, pgx.RowToAddrOfStructByName[endUserPolicyRow])
	if err != nil {
		return nil, classify(fmt.Errorf("budget: end-user policies: %w", err), false, false)
	}
	c := &policyCopy{at: at, byTenant: make(map[string]*EndUserPolicy, len(rs))}
	for _, r := range rs {
		p, err := r.policy()
		if err != nil {
			return nil, err
		}
		c.byTenant[p.TenantID] = p
	}
	s.endUserPolicies.Store(c)
	return c, nil
}

// policyCache is the store's cache of the end_user_policies table: the
// copy it decides with, and how it is refreshed (EndUserPolicyOf).
type policyCache struct {
	endUserPolicies   atomic.Pointer[policyCopy]
	endUserRefreshing atomic.Bool
	endUserLoading    sync.Mutex
	endUserFailed     *failedRead // the last first read's failure, under endUserLoading
}

// failedRead is a read that failed, and when.
type failedRead struct {
	at  time.Time
	err error
}
