package lease

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/ledger/pgarray"
)

//go:embed sql/lease_credentials_same.sql
var leaseCredentialsSameSQL string

// A journal group is written in one round trip when nothing in it needs
// a decision that only a read inside its transaction can make: BEGIN, the
// keys' advisory locks, the lease use, the check of its credentials, the
// insert of every row and COMMIT are sent at once. The careful way
// (write's second half) reads the keys, the lease use's verdict and the
// credentials first, applies the rules in Go, and sends the writes and
// COMMIT in a second round trip. On the rate limit service's loads the
// second round trip cost 10 % to 14 % of the calls a replica answers
// (BENCHMARKS.md, "Quota leasing, fifth step").
//
// The one round trip holds the same rules, because each read it skips is
// replaced by a guard in the statement that would have acted on it
// (lease_journal_guard, 00035), which fails the transaction, so that the
// COMMIT sent after it rolls back, whenever the careful way would have
// written anything else than every row as sent:
//
//   - a lease that refuses the group (ended, expired by the store's clock,
//     short, or another tenant's): lease_use.sql with $5;
//   - an Idempotency-Key of the group that idempotency_keys holds (a
//     replay, or one forgotten and not purged yet):
//     admission_insert_leased.sql, whose plain insert fails on it
//     (unique_violation; the careful way deletes a forgotten one first);
//   - a credential that refuses an admission: the group is sent in one
//     round trip only if the credentials as the journal last read them
//     (creds) pass every rule, and lease_credentials_same.sql checks, after
//     the leases are locked as the careful read is, that each row is still
//     the version read. So the rules are applied to the rows as they are.
//
// A group the guard stopped, or any statement error, is written again the
// careful way, which answers each admission as before. That costs a round
// trip and a transaction when a lease ends or a request is retried, which
// is rare beside the groups that commit at once.

// creds is what the journal last read of the credentials its groups came
// with: a key or gateway it has not read, or read refusing, sends its
// group the careful way, which reads them (and refreshes creds). It also
// keeps each lease's tenant, as a careful group's lease use returned it,
// for admissions that come without theirs (a lease's tenant never
// changes).
type creds struct {
	mu      sync.Mutex
	keys    map[string]key
	gws     map[string]gateway
	tenants map[string]string // lease id: its tenant
}

// maxCreds bounds creds: past it the journal forgets them all and reads
// again as groups need them.
const maxCreds = 4096

// remember records what a careful group read of the credentials asked
// for: those read, and the absence of the others (unknown, or a gateway
// revoked).
func (c *creds) remember(keyIDs []string, keys map[string]key, gwIDs []string, gws map[string]gateway, tenants map[string]string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.keys == nil || len(c.keys)+len(c.gws)+len(c.tenants) > maxCreds {
		c.keys, c.gws, c.tenants = map[string]key{}, map[string]gateway{}, map[string]string{}
	}
	for id, t := range tenants {
		if t != "" {
			c.tenants[id] = t
		}
	}
	for _, id := range keyIDs {
		if k, ok := keys[id]; ok {
			c.keys[id] = k
		} else {
			delete(c.keys, id)
		}
	}
	for _, id := range gwIDs {
		if g, ok := gws[id]; ok {
			c.gws[id] = g
		} else {
			delete(c.gws, id)
		}
	}
}

// tenant is the tenant of a lease a careful group used ("" if none did).
func (c *creds) tenant(leaseID string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.tenants[leaseID]
}

// known returns the credentials named, as last read, or ok false if one
// was never read.
func (c *creds) known(keyIDs, gwIDs []string) (keys map[string]key, gws map[string]gateway, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	keys, gws = make(map[string]key, len(keyIDs)), make(map[string]gateway, len(gwIDs))
	for _, id := range keyIDs {
		k, found := c.keys[id]
		if !found {
			return nil, nil, false
		}
		keys[id] = k
	}
	for _, id := range gwIDs {
		g, found := c.gws[id]
		if !found {
			return nil, nil, false
		}
		gws[id] = g
	}
	return keys, gws, true
}

// rounds counts the groups written each way: the test signal that the
// common group commits in one round trip, and that a guard stopped one
// and sent it the careful way.
type rounds struct {
	once    atomic.Int64 // committed in one round trip
	stopped atomic.Int64 // sent in one round trip, stopped by the guard or an error
	careful atomic.Int64 // written the careful way (after a stop, or not tried)
}

// JournalStats counts a journal's group commits by the way they were
// written (the replica's tokengate_lease_journal_* metrics).
type JournalStats struct {
	// OneRoundTrip committed sent whole, COMMIT included.
	OneRoundTrip int64
	// Stopped were sent whole and rolled back by a guard (a lease that
	// refused, a live key, a credential changed) or a statement's error,
	// then written the careful way.
	Stopped int64
	// TwoRoundTrips were written the careful way: after a stop, or at
	// once (a credential the journal had not read, or that refuses).
	TwoRoundTrips int64
}

// Stats returns how j's groups were written so far.
func (j *Journal) Stats() JournalStats {
	return JournalStats{OneRoundTrip: j.rounds.once.Load(), Stopped: j.rounds.stopped.Load(), TwoRoundTrips: j.rounds.careful.Load()}
}

// group is one group as write prepares it: its leases in lock order, each
// one's requests and cost, its keys (tenant, stored key) and its
// credentials.
type group struct {
	order         []string
	byReq         map[string][]*appendReq
	sums          []int64
	tenants, keys []string // the group's Idempotency-Keys, with their tenants
	keyIDs, gwIDs []string
	clock         *time.Time
	n             int      // requests
	key           groupKey // the groups shape's group (name)
}

// writeOnce writes g in one round trip if it can be: ok false when it
// cannot be tried (a credential not read yet, or refusing; admissions of
// one lease naming two tenants, or none where no careful group used the
// lease yet), or when the guard stopped it (the transaction rolled back;
// nothing of it was written). An error is one whose outcome is unknown
// (the connection failed): the caller answers it as the careful way's
// failures are.
func (j *Journal) writeOnce(ctx context.Context, conn *pgxpool.Conn, g *group) (ok bool, err error) {
	tenantOf := make([]string, len(g.order))
	verdict := make(map[string]string, len(g.order))
	for k, id := range g.order {
		for _, r := range g.byReq[id] {
			switch t := r.a.TenantID; {
			case t == "" && r.a.storedKey() != "":
				return false, nil // its key's lock is taken by the tenant it names
			case t == "":
			case tenantOf[k] != "" && tenantOf[k] != t:
				return false, nil
			default:
				tenantOf[k] = t
			}
		}
		if tenantOf[k] == "" {
			if tenantOf[k] = j.creds.tenant(id); tenantOf[k] == "" {
				return false, nil
			}
		}
		verdict[id] = tenantOf[k]
	}
	keys, gws, known := j.creds.known(g.keyIDs, g.gwIDs)
	if !known || len(refuseByKey(g.order, g.byReq, verdict, keys, gws)) > 0 {
		return false, nil
	}
	var rows account.Leased
	rows.Grow(g.n)
	var ends account.LeasedEnds
	for k, id := range g.order {
		for _, r := range g.byReq[id] {
			if e := r.end; e != nil {
				ends.Add(e.AdmissionID, id, e.InputTokens, e.OutputTokens, e.ActualCost, e.MoneyActual, e.RefundMicro)
				continue
			}
			a := r.a.Admission
			a.TenantID = tenantOf[k] // the lease's, checked by the use ($4)
			rows.Add(id, r.a.Actor, &a, r.a.storedKey(), r.a.RequestHash, r.a.Response, r.a.ReservationTTL)
		}
	}
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	account.QueueGenericPlans(b)
	if len(g.keys) > 0 {
		account.QueueKeyLock(b, g.tenants, g.keys)
	}
	b.Queue(leaseUseSQL, pgarray.Texts(g.order), pgarray.Int8s(g.sums), g.clock, pgarray.Texts(tenantOf), true)
	if len(g.keyIDs)+len(g.gwIDs) > 0 {
		keyVers, gwVers := make([]string, len(g.keyIDs)), make([]string, len(g.gwIDs))
		for i, id := range g.keyIDs {
			keyVers[i] = keys[id].version
		}
		for i, id := range g.gwIDs {
			gwVers[i] = gws[id].version
		}
		b.Queue(leaseCredentialsSameSQL, pgarray.Texts(g.keyIDs), pgarray.Texts(keyVers), pgarray.Texts(g.gwIDs), pgarray.Texts(gwVers))
	}
	switch {
	case j.s.groups:
		account.QueueLeasedGroup(b, j.s.holder, g.key.holder, g.key.count, &rows, &ends, g.clock, true)
	default:
		if rows.Len() > 0 {
			account.QueueLeased(b, &rows, g.clock)
		}
		if ends.Len() > 0 {
			account.QueueLeasedEnds(b, &ends, g.clock, true)
		}
	}
	b.Queue("COMMIT")
	err = conn.SendBatch(ctx, b).Close()
	if err == nil {
		j.rounds.once.Add(1)
		return true, nil
	}
	_, _ = conn.Exec(ctx, "ROLLBACK")
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		j.rounds.stopped.Add(1)
		// The guard, or a statement's error (a duplicate id): the careful
		// way writes the group, or finds the row at fault.
		return false, nil
	}
	return false, fmt.Errorf("lease: journal: %w", err)
}
