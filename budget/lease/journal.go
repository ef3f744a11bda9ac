package lease

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
)

var (
	//go:embed sql/lease_use.sql
	leaseUseSQL string
	//go:embed sql/lease_admissions_insert.sql
	leaseAdmissionsInsertSQL string
	//go:embed sql/lease_keys.sql
	leaseKeysSQL string
	//go:embed sql/lease_unuse.sql
	leaseUnuseSQL string
)

// Admission is one admission made from a lease, as the journal records it.
type Admission struct {
	ID        string
	Model     string
	Cost      int64  // cost units, as the admission's reserve entry records
	CostMicro int64  // what it takes from the lease
	Money     *int64 // micro-units of the currency; nil when unpriced
	// KeyID is the tenant key the request came with ("" for none): the
	// group refuses the admission if the key is revoked or not the lease's
	// tenant's (rule.ErrKeyRevoked) or the model is outside its scope
	// (*rule.ModelNotAllowedError), as a decision does.
	KeyID string
}

// maxGroup caps the admissions of one group commit.
const maxGroup = 512

type appendReq struct {
	leaseID string
	a       Admission
	done    chan error
}

// Journal makes admissions from leases durable before they are answered,
// many per transaction (group commit): while one group commits, the next
// gathers. A group takes no tenant row lock: per lease, one statement adds
// the group's cost to the lease's used amount (refused unless the lease is
// live, unexpired by the store's clock and keeps the sum within its
// slice), and one inserts its rows. The lease row's lock orders the group
// against the lease's renew, return or expiry, which lock it after the
// tenant rows: an admission is either journaled before the lease ends, and
// reconciled by its end, or refused.
type Journal struct {
	s       *Store
	reqs    chan *appendReq
	stopped chan struct{} // closed when Run returns
}

// ErrStopped: the journal's Run has returned; nothing more is journaled.
var ErrStopped = errors.New("lease: the journal is stopped")

// NewJournal returns a journal of s's leases; Run commits its groups.
func NewJournal(s *Store) *Journal {
	return &Journal{s: s, reqs: make(chan *appendReq, maxGroup), stopped: make(chan struct{})}
}

// Append journals a, made from leaseID, and returns once its group has
// committed: nil means durable. ErrOver: the lease ended, expired or is
// short (the admission was not made). An error of ctx leaves the outcome
// unknown; the caller must not answer the admission as made (if it was
// journaled, its cost stays charged, never spent twice). ErrStopped: Run
// returned before the admission's group committed.
func (j *Journal) Append(ctx context.Context, leaseID string, a Admission) error {
	r := &appendReq{leaseID: leaseID, a: a, done: make(chan error, 1)}
	select {
	case j.reqs <- r:
	case <-ctx.Done():
		return ctx.Err()
	case <-j.stopped:
		return ErrStopped
	}
	select {
	case err := <-r.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	case <-j.stopped:
		// A group that committed as Run stopped has answered already.
		select {
		case err := <-r.done:
			return err
		default:
			return ErrStopped
		}
	}
}

// Run commits groups until ctx ends; the group in flight then still
// commits and is answered. Run must be called once.
func (j *Journal) Run(ctx context.Context) {
	defer close(j.stopped)
	for {
		var group []*appendReq
		select {
		case <-ctx.Done():
			return
		case r := <-j.reqs:
			group = append(group, r)
		}
	gather:
		for len(group) < maxGroup {
			select {
			case r := <-j.reqs:
				group = append(group, r)
			default:
				break gather
			}
		}
		j.commit(context.WithoutCancel(ctx), group)
	}
}

// commit writes one group in one transaction and answers each request.
func (j *Journal) commit(ctx context.Context, group []*appendReq) {
	byLease := map[string][]*appendReq{}
	var order []string
	for _, r := range group {
		if _, ok := byLease[r.leaseID]; !ok {
			order = append(order, r.leaseID)
		}
		byLease[r.leaseID] = append(byLease[r.leaseID], r)
	}
	// Leases are locked by id, as an admin change locks a tree's
	// (EndLocked), so that the two never wait for each other in a cycle.
	slices.Sort(order)
	verdict, refused, err := j.write(ctx, order, byLease)
	for _, id := range order {
		for _, r := range byLease[id] {
			switch {
			case err != nil:
				r.done <- err
			case verdict[id] == "":
				r.done <- ErrOver
			case refused[r] != nil:
				r.done <- refused[r]
			default:
				r.done <- nil
			}
		}
	}
}

// write is a group's transaction: a round trip that begins and uses each
// lease (the statements that may refuse) and then reads the admissions'
// keys, then one that inserts the rows of the leases that accepted, less
// the admissions their keys refuse (the lease's use cut back by their
// cost), and commits. verdict is the tenant of each lease that accepted.
func (j *Journal) write(ctx context.Context, order []string, byLease map[string][]*appendReq) (verdict map[string]string, refused map[*appendReq]error, err error) {
	conn, err := j.s.acct.Pool().Acquire(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("lease: journal: acquire: %w", err)
	}
	defer conn.Release()
	clock := j.s.frozen()
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	for _, id := range order {
		var sum int64
		for _, r := range byLease[id] {
			sum += r.a.CostMicro
		}
		b.Queue(leaseUseSQL, id, sum, clock)
	}
	keyIDs := groupKeys(order, byLease)
	if len(keyIDs) > 0 {
		b.Queue(leaseKeysSQL, keyIDs)
	}
	verdict = make(map[string]string, len(order))
	var keys map[string]key
	err = func() error {
		br := conn.SendBatch(ctx, b)
		defer br.Close()
		if _, err := br.Exec(); err != nil {
			return err
		}
		for _, id := range order {
			var tenant string
			switch err := br.QueryRow().Scan(&tenant); {
			case errors.Is(err, pgx.ErrNoRows):
			case err != nil:
				return err
			default:
				verdict[id] = tenant
			}
		}
		if len(keyIDs) > 0 {
			var err error
			if keys, err = readKeys(br); err != nil {
				return err
			}
		}
		return br.Close()
	}()
	if err != nil {
		_, _ = conn.Exec(ctx, "ROLLBACK")
		return nil, nil, fmt.Errorf("lease: journal: use: %w", err)
	}
	refused = refuseByKey(order, byLease, verdict, keys)
	b = &pgx.Batch{}
	for _, id := range order {
		if verdict[id] == "" {
			continue
		}
		rs, cut := admitted(byLease[id], refused)
		if cut > 0 {
			b.Queue(leaseUnuseSQL, id, cut)
		}
		if len(rs) == 0 {
			continue
		}
		ids, models, costs, micros, money := make([]string, len(rs)), make([]string, len(rs)), make([]int64, len(rs)), make([]int64, len(rs)), make([]*int64, len(rs))
		for i, r := range rs {
			ids[i], models[i], costs[i], micros[i], money[i] = r.a.ID, r.a.Model, r.a.Cost, r.a.CostMicro, r.a.Money
		}
		b.Queue(leaseAdmissionsInsertSQL, id, ids, models, costs, micros, money, clock)
	}
	b.Queue("COMMIT")
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		_, _ = conn.Exec(ctx, "ROLLBACK")
		return nil, nil, fmt.Errorf("lease: journal: insert: %w", err)
	}
	return verdict, refused, nil
}
