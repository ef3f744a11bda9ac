package account

// End users (issue 25): a tenant's own users, each a leaf budget below the
// tenant, created on first sight from the tenant's end-user policy.
//
// An end user is an ordinary tenant row (end_user_of names its tenant,
// end_user_id the id the tenant's requests name it by), a child of its
// tenant, so every rule of nested budgets holds for it unchanged: a
// decision locks it with its ancestors, root first, debits every level
// and writes every level's own ledger entry. What is particular to end
// users is only how their rows come and go, and each of those changes
// holds the tenant's row lock (or, for idle expiry, the end user's, below
// its tenant's), with its ledger entry:
//
//   - EndUserEnsure creates an end user from the template on first sight
//     (a tenant entry in its own chain, as CreateTenant writes), or revives
//     an expired one; both under the tenant's lock, after counting the
//     tenant's live end users, so the cap is exact however many replicas
//     see new end users at once, and one end user is one row.
//   - EndUserPolicySet writes the policy with a limits entry in the
//     tenant's chain and, in the same transaction, applies a changed
//     template to every live end user (each its own limits entry): no
//     decision ever sees half a template change.
//   - EndUserExpireIdle marks an end user expired (a tenant entry) once it
//     has had no change for the policy's idle TTL and holds no open
//     reservation. An expired end user keeps its row, balances and chain;
//     it stops counting toward the cap, and a reserve for it is refused
//     with rule.ErrEndUserExpired until EndUserEnsure revives it (cap applies).

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/ledger"
)

var (
	//go:embed sql/end_user_policy_get.sql
	endUserPolicyGetSQL string
	//go:embed sql/end_user_policy_all.sql
	endUserPolicyAllSQL string
	//go:embed sql/end_user_policy_put.sql
	endUserPolicyPutSQL string
	//go:embed sql/end_user_policy_delete.sql
	endUserPolicyDeleteSQL string
	//go:embed sql/end_user_live_count.sql
	endUserLiveCountSQL string
	//go:embed sql/end_user_live_lock.sql
	endUserLiveLockSQL string
	//go:embed sql/end_user_set_expired.sql
	endUserSetExpiredSQL string
	//go:embed sql/end_user_idle.sql
	endUserIdleSQL string
	//go:embed sql/end_user_list.sql
	endUserListSQL string
	//go:embed sql/end_user_lock.sql
	endUserLockSQL string
	//go:embed sql/end_user_admission_tenant.sql
	endUserAdmissionTenantSQL string
)

// EndUserEnsure returns the tenant id of the end user endUserID of tenant
// parent (rule.EndUserTenantID), creating it from the parent's template on
// first sight, or reviving it if it expired, in one short transaction
// that holds the parent's lock (with its ancestors', root first, and the
// end user's when it exists, as a decision takes them): concurrent first
// sights of one end user from any replicas make exactly one row, and the
// live end users never exceed the policy's cap. A created end user's
// first entry is its tenant entry (kind tenant, event created, as
// CreateTenant writes); a revival keeps the end user's balances and chain
// and appends a tenant entry (event revived), after a limits entry if the
// template changed while it was expired. It returns rule.ErrEndUserCap,
// rule.ErrNoEndUserPolicy, ErrTenantNotFound, ErrTenantDisabled (the tenant or
// an ancestor is: it would admit nothing), or an *InvalidError (a bad id).
func (s *Store) EndUserEnsure(ctx context.Context, parent, endUserID string) (string, error) {
	if err := rule.ValidateEndUserID("end_user", endUserID); err != nil {
		return "", err
	}
	childID := rule.EndUserTenantID(parent, endUserID)
	var pol *EndUserPolicy
	var live int
	var c *tenant
	tx, ts, now, err := s.lockTenants(ctx, []string{parent},
		func(b *pgx.Batch) {
			b.Queue(endUserLockSQL, childID)
			b.Queue(endUserPolicyGetSQL, parent)
			b.Queue(endUserLiveCountSQL, parent)
		},
		func(br pgx.BatchResults) error {
			cs, err := scanTenants(br.Query())
			if err != nil {
				return err
			}
			c = cs[childID]
			if pol, err = scanPolicy(br.Query()); err != nil {
				return err
			}
			return br.QueryRow().Scan(&live)
		})
	if err != nil {
		return "", err
	}
	t := ts[parent]
	switch {
	case t == nil:
		tx.abort()
		return "", rule.ErrTenantNotFound
	case pol == nil:
		tx.abort()
		return "", rule.ErrNoEndUserPolicy
	case disabledChain(ts, t):
		tx.abort()
		return "", rule.ErrTenantDisabled // it would admit nothing: no end user is made for it
	case c != nil && c.endUserOf != parent:
		tx.abort()
		return "", fmt.Errorf("budget: end user %q of %s: its tenant id %s is taken by a tenant that is not its end user", endUserID, parent, childID)
	case c != nil && !c.endUserExpired:
		tx.abort()
		return childID, nil
	case live >= pol.MaxEndUsers:
		tx.abort()
		return "", rule.ErrEndUserCap
	}
	w := &writes{}
	if c != nil {
		c.advance(now)
		if !rule.SameLimits(c.Limits, pol.Template) {
			if err := c.relimit(pol.Template, now, "end-user-template", w); err != nil {
				tx.abort()
				return "", err
			}
		}
		c.endUserExpired = false
		e := c.entry(ledger.KindTenant, now, "end-user:"+parent)
		e.Reason = "end user seen again: revived"
		e.Detail = `{"event":"end_user_revived"}`
		c.seal(e)
		w.statement(1, endUserSetExpiredSQL, c.id, nil)
		w.entry(c, e)
	} else {
		if len(t.path)+1 >= rule.MaxDepth {
			tx.abort()
			return "", &rule.LimitError{Field: "tenant", Reason: fmt.Sprintf("%s is too deep to have end users", parent)}
		}
		p := CreateTenantParams{ID: childID, Limits: pol.Template, Parent: parent, Actor: "end-user:" + parent}
		detail, err := json.Marshal(struct {
			Event   string            `json:"event"`
			Parent  string            `json:"parent"`
			EndUser string            `json:"end_user"`
			Limits  rule.LimitsDetail `json:"limits"`
		}{"created", parent, endUserID, pol.Template.Detail()})
		if err != nil {
			tx.abort()
			return "", fmt.Errorf("budget: encode limits: %w", err)
		}
		path := append(append([]string{}, t.path...), parent)
		nt, e, args := newTenant(p, path, now, string(detail), endUserID)
		w.statement(1, tenantInsertSQL, args...)
		w.entry(nt, e)
	}
	if err := tx.commit(ctx, w); err != nil {
		return "", err
	}
	return childID, nil
}

// EndUserSweepEvery is how often a replica's sweeps look for idle end
// users: the scan reads every live end user's row (an index on their last
// change would cost every decision its HOT update), and an idle TTL is
// meant in minutes or more, so a minute late is on time.
const EndUserSweepEvery = time.Minute

// endUserSweepDue reports whether this replica's sweep should look for
// idle end users now (by the store's clock: a test's frozen one), and
// if so marks it done.
func (s *Store) endUserSweepDue() bool {
	now := time.Now()
	if s.nowFunc != nil {
		now = s.nowFunc()
	}
	last := s.endUserSwept.Load()
	if last != 0 && now.Sub(time.Unix(0, last)) < EndUserSweepEvery && now.UnixNano() >= last {
		return false
	}
	return s.endUserSwept.CompareAndSwap(last, now.UnixNano())
}

// disabledChain reports whether t or one of its ancestors (locked in ts)
// is disabled.
func disabledChain(ts map[string]*tenant, t *tenant) bool {
	chain, err := chainOf(ts, t)
	return err == nil && anyDisabled(chain)
}

// EndUserExpireIdle marks expired, up to limit of them, the end users
// that had no change for their policy's idle TTL and hold no open
// reservation, each under its lock (with its ancestors') and with a tenant
// entry; the sweeper calls it. An expired end user keeps everything it
// spent: only the cap stops counting it. It says how many it expired.
func (s *Store) EndUserExpireIdle(ctx context.Context, limit int) (int, error) {
	rows, err := s.pool.Query(ctx, endUserIdleSQL, s.clock(), limit)
	if err != nil {
		return 0, fmt.Errorf("budget: idle end users: %w", err)
	}
	type idle struct {
		ID     string `db:"id"`
		Parent string `db:"end_user_of"`
	}
	ids, err := pgx.CollectRows(rows, pgx.RowToStructByName[idle])
	if err != nil {
		return 0, fmt.Errorf("budget: idle end users: %w", err)
	}
	n := 0
	for _, it := range ids {
		ok, err := s.expireEndUser(ctx, it.ID, it.Parent)
		if err != nil {
			return n, err
		}
		if ok {
			n++
		}
	}
	return n, nil
}

// expireEndUser expires one end user if, under its lock, it is still
// idle; it says whether it did.
func (s *Store) expireEndUser(ctx context.Context, id, parent string) (bool, error) {
	var pol *EndUserPolicy
	tx, t, now, err := s.lockTenant(ctx, id,
		func(b *pgx.Batch) { b.Queue(endUserPolicyGetSQL, parent) },
		func(br pgx.BatchResults) (err error) { pol, err = scanPolicy(br.Query()); return err })
	if errors.Is(err, rule.ErrTenantNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	idleSince := t.Tokens.At // the last change written, before refilling to now
	if pol == nil || t.endUserOf != parent || t.endUserExpired || t.Open > 0 || now.Sub(idleSince) < pol.IdleTTL {
		tx.abort()
		return false, nil
	}
	t.advance(now)
	t.endUserExpired = true
	e := t.entry(ledger.KindTenant, now, "sweeper")
	e.Reason = "end user idle since " + idleSince.UTC().Format(time.RFC3339) + ": expired"
	e.Detail = `{"event":"end_user_expired"}`
	t.seal(e)
	w := &writes{}
	w.statement(1, endUserSetExpiredSQL, t.id, &now)
	w.entry(t, e)
	if err := tx.commit(ctx, w); err != nil {
		return false, err
	}
	return true, nil
}

// EndUser is one of a tenant's end users, as listed.
type EndUser struct {
	// EndUserID is the id the tenant's requests name it by.
	EndUserID string
	CreatedAt time.Time
	// LastSeen is its last change (a decision, an expiry, a limits change).
	LastSeen  time.Time
	ExpiredAt *time.Time
	// Snapshot holds its tenant id, limits and balances, refilled to now.
	Snapshot rule.Snapshot
}

// EndUserList returns up to limit of a tenant's end users whose tenant id
// sorts after after ("" from the first), in tenant id order, refilled to
// the database's clock now, without locks.
func (s *Store) EndUserList(ctx context.Context, parent, after string, limit int) ([]EndUser, error) {
	return readNow(ctx, s, "list end users", endUserListSQL, []any{parent, after, limit}, func(r *tenantRow, now time.Time) EndUser {
		t := r.tenant()
		lastSeen := t.Tokens.At
		t.advance(now)
		return EndUser{EndUserID: deref0(r.EndUserID), CreatedAt: r.CreatedAt, LastSeen: lastSeen, ExpiredAt: r.EndUserExpiredAt,
			Snapshot: t.snapshot(now)}
	})
}

// EndUserAdmissionTenant returns the end user of parent whose admission
// admissionID is, or "" when it is no admission of parent's end users (one
// read; a face settling by id with the parent's credential calls it only
// when the parent has an end-user policy).
func (s *Store) EndUserAdmissionTenant(ctx context.Context, parent, admissionID string) (string, error) {
	var id string
	err := s.pool.QueryRow(ctx, endUserAdmissionTenantSQL, admissionID, parent).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", classify(fmt.Errorf("budget: admission's end user: %w", err), false, false)
	}
	return id, nil
}
