package account

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/ledger"
)

// EndUserPolicyRefresh is how stale a replica's copy of the end-user
// policies may be: a policy written through another replica applies
// within it (one written through this replica's store applies at once).
// Until then, requests of a tenant whose policy is new are decided as the
// tenant's own; of a deleted policy, as end users that exist already
// (a new one is refused rule.ErrNoEndUserPolicy by EndUserEnsure and decided as
// the tenant's).
const EndUserPolicyRefresh = 5 * time.Second

// EndUserPolicy is a tenant's end-user policy.
type EndUserPolicy struct {
	TenantID string
	Source   rule.EndUserSource
	// Header names the header of rule.SourceHeader (canonical form).
	Header string
	// Template is the limits each end user is created with.
	Template    rule.Limits
	MaxEndUsers int
	// IdleTTL is how long an end user may go without a change before it
	// expires.
	IdleTTL   time.Duration
	UpdatedAt time.Time
	UpdatedBy string
}

// EndUserPolicyParams sets a tenant's end-user policy.
type EndUserPolicyParams struct {
	TenantID    string
	Source      rule.EndUserSource
	Header      string
	Template    rule.Limits
	MaxEndUsers int
	IdleTTL     time.Duration
	Actor       string
}

// check validates p (rule.CheckEndUserPolicy), filling the template's
// defaults and putting its header in canonical form; it returns a *LimitError naming the field.
func (p *EndUserPolicyParams) check() error {
	header, err := rule.CheckEndUserPolicy(p.Source, p.Header, &p.Template, p.MaxEndUsers, p.IdleTTL)
	if err != nil {
		return err
	}
	p.Header = header
	return nil
}

// endUserPolicyRow is a row of end_user_policies.
type endUserPolicyRow struct {
	TenantID    string          `db:"tenant_id"`
	Source      string          `db:"source"`
	Header      *string         `db:"header"`
	Template    json.RawMessage `db:"template"`
	MaxEndUsers int             `db:"max_end_users"`
	IdleTTLS    int64           `db:"idle_ttl_s"`
	UpdatedAt   time.Time       `db:"updated_at"`
	UpdatedBy   string          `db:"updated_by"`
}

func (r *endUserPolicyRow) policy() (*EndUserPolicy, error) {
	var d rule.LimitsDetail
	if err := json.Unmarshal(r.Template, &d); err != nil {
		return nil, fmt.Errorf("budget: end-user template of %s: %w", r.TenantID, err)
	}
	l, err := d.Limits()
	if err != nil {
		return nil, fmt.Errorf("budget: end-user template of %s: %w", r.TenantID, err)
	}
	return &EndUserPolicy{TenantID: r.TenantID, Source: rule.EndUserSource(r.Source), Header: deref0(r.Header), Template: l,
		MaxEndUsers: r.MaxEndUsers, IdleTTL: time.Duration(r.IdleTTLS) * time.Second, UpdatedAt: r.UpdatedAt, UpdatedBy: r.UpdatedBy}, nil
}

// scanPolicy reads at most one policy row (nil for none).
func scanPolicy(rows pgx.Rows, err error) (*EndUserPolicy, error) {
	if err != nil {
		return nil, err
	}
	r, err := pgx.CollectOneRow(rows, pgx.RowToAddrOfStructByName[endUserPolicyRow])
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("budget: scan end-user policy: %w", err)
	}
	return r.policy()
}

// policyDetail is a policy as the tenant's limits entry records it.
type policyDetail struct {
	Source      rule.EndUserSource `json:"source"`
	Header      string             `json:"header,omitempty"`
	Template    rule.LimitsDetail  `json:"template"`
	MaxEndUsers int                `json:"max_end_users"`
	IdleTTLS    int64              `json:"idle_ttl_s"`
}

func policyDetailOf(p *EndUserPolicy) *policyDetail {
	if p == nil {
		return nil
	}
	return &policyDetail{Source: p.Source, Header: p.Header, Template: p.Template.Detail(), MaxEndUsers: p.MaxEndUsers,
		IdleTTLS: int64(p.IdleTTL / time.Second)}
}

// EndUserPolicySet writes a tenant's end-user policy under the tenant's
// row lock, with a limits entry (the policy before and after) in the
// tenant's chain. When the template changes, every live end user gets the
// new limits in the same transaction, each under its own lock with its
// limits entry (as UpdateLimits would write it): one transaction, so a
// template change is all or nothing, and its size is bounded by the cap
// (rule.MaxEndUsersCap). Expired end users get the template when revived. A
// tenant that is itself an end user, or too deep for a child
// (MaxDepth), cannot have a policy. It returns a *LimitError
// (ErrInvalidLimits) or ErrTenantNotFound.
func (s *Store) EndUserPolicySet(ctx context.Context, p EndUserPolicyParams) (*EndUserPolicy, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	var before *EndUserPolicy
	tx, t, now, err := s.lockTenant(ctx, p.TenantID,
		func(b *pgx.Batch) { b.Queue(endUserPolicyGetSQL, p.TenantID) },
		func(br pgx.BatchResults) (err error) { before, err = scanPolicy(br.Query()); return err })
	if err != nil {
		return nil, err
	}
	switch {
	case t.endUserOf != "":
		tx.abort()
		return nil, &rule.LimitError{Field: "tenant", Reason: "an end user cannot have end users of its own"}
	case len(t.path)+1 >= rule.MaxDepth:
		tx.abort()
		return nil, &rule.LimitError{Field: "tenant", Reason: fmt.Sprintf("budgets nest at most %d levels, and %s is at level %d: its end users would be one too many", rule.MaxDepth, t.id, len(t.path)+1)}
	}
	after := &EndUserPolicy{TenantID: p.TenantID, Source: p.Source, Header: p.Header, Template: p.Template,
		MaxEndUsers: p.MaxEndUsers, IdleTTL: p.IdleTTL, UpdatedAt: now, UpdatedBy: actorOr(p.Actor, "admin")}
	w := &writes{}
	if before != nil && !rule.SameLimits(before.Template, after.Template) {
		countTrip(ctx)
		rows, err := tx.conn.Query(ctx, endUserLiveLockSQL, p.TenantID)
		ends, err := scanTenants(rows, err)
		if err != nil {
			tx.abort()
			return nil, s.classify(ctx, fmt.Errorf("budget: lock end users: %w", err), false, false, time.Now())
		}
		for _, id := range slices.Sorted(maps.Keys(ends)) {
			if err := ends[id].relimit(after.Template, now, after.UpdatedBy, w); err != nil {
				tx.abort()
				return nil, err
			}
		}
	}
	if err := s.writePolicy(t, before, after, now, after.UpdatedBy, w); err != nil {
		tx.abort()
		return nil, err
	}
	if err := tx.commit(ctx, w); err != nil {
		return nil, err
	}
	s.endUserPolicies.Store(nil)
	return after, nil
}

// writePolicy queues a policy change (after nil: deleted) and the limits
// entry that records it in the tenant's chain.
func (s *Store) writePolicy(t *tenant, before, after *EndUserPolicy, now time.Time, actor string, w *writes) error {
	detail, err := json.Marshal(struct {
		Event  string        `json:"event"`
		Before *policyDetail `json:"before"`
		After  *policyDetail `json:"after"`
	}{"end_user_policy", policyDetailOf(before), policyDetailOf(after)})
	if err != nil {
		return fmt.Errorf("budget: encode end-user policy: %w", err)
	}
	t.advance(now)
	if after != nil {
		var header *string
		if after.Source == rule.SourceHeader {
			header = &after.Header
		}
		w.statement(1, endUserPolicyPutSQL, after.TenantID, string(after.Source), header, rule.LimitsJSON(after.Template),
			after.MaxEndUsers, int64(after.IdleTTL/time.Second), now, after.UpdatedBy)
	} else {
		w.statement(1, endUserPolicyDeleteSQL, t.id)
	}
	e := t.entry(ledger.KindLimits, now, actor)
	e.Reason = "end-user policy set"
	if after == nil {
		e.Reason = "end-user policy deleted"
	}
	e.Detail = string(detail)
	t.seal(e)
	w.entry(t, e)
	return nil
}

// EndUserPolicyDelete deletes a tenant's end-user policy, with a limits
// entry in its chain. Its end users stay (balances, chains, and their
// admissions to settle), but no new one is created, and the tenant's
// requests are decided as its own. It returns rule.ErrNoEndUserPolicy or
// ErrTenantNotFound.
func (s *Store) EndUserPolicyDelete(ctx context.Context, tenantID, actor string) error {
	var before *EndUserPolicy
	tx, t, now, err := s.lockTenant(ctx, tenantID,
		func(b *pgx.Batch) { b.Queue(endUserPolicyGetSQL, tenantID) },
		func(br pgx.BatchResults) (err error) { before, err = scanPolicy(br.Query()); return err })
	if err != nil {
		return err
	}
	if before == nil {
		tx.abort()
		return rule.ErrNoEndUserPolicy
	}
	w := &writes{}
	if err := s.writePolicy(t, before, nil, now, actorOr(actor, "admin"), w); err != nil {
		tx.abort()
		return err
	}
	if err := tx.commit(ctx, w); err != nil {
		return err
	}
	s.endUserPolicies.Store(nil)
	return nil
}

// EndUserPolicyGet returns a tenant's end-user policy, read now. It
// returns rule.ErrNoEndUserPolicy.
func (s *Store) EndUserPolicyGet(ctx context.Context, tenantID string) (*EndUserPolicy, error) {
	var p *EndUserPolicy
	err := retry(ctx, func() error {
		var err error
		p, err = scanPolicy(s.pool.Query(ctx, endUserPolicyGetSQL, tenantID))
		return classify(err, false, false)
	})
	if err == nil && p == nil {
		err = rule.ErrNoEndUserPolicy
	}
	return p, err
}
