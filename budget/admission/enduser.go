package admission

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

// EndUser is what a face found in a request that may name the caller's end
// user: the body's candidate fields and, for an HTTP face, its headers.
// Which one counts is the tenant's end-user policy's (account.EndUserPolicy),
// so a face extracts them all, cheaply, and never reads a policy.
type EndUser struct {
	Fields estimator.EndUserFields
	// HeaderFunc returns a request header's value ("" when absent); nil for
	// a face without headers.
	HeaderFunc func(name string) string
}

// id is the end-user id the request gives from pol's source, the field it
// names (for errors), and whether it gives one at all.
//
// A body source names the field of the request's wire that carries it
// (estimator.EndUserFields.Field): on Anthropic's Messages wire,
// metadata.user_id for every body source, so that a policy of user names
// a Claude call's end user as it does an OpenAI call's. A request that
// does not give the field the policy reads but names an end user in
// another one (safety_identifier under a policy of user, a body's user
// under a policy of a header) is refused, naming the field the policy
// reads: deciding it as the tenant's own would charge the team for an end
// user's call in silence. A request that names no end user at all is the
// tenant's own.
func (e EndUser) id(pol *account.EndUserPolicy) (id, field string, present bool, err error) {
	var v any
	field = e.Fields.Field(string(pol.Source))
	switch pol.Source {
	case rule.SourceUser, rule.SourceSafetyIdentifier, rule.SourceMetadataUserID:
		v = e.Fields.Value(field)
	case rule.SourceHeader:
		field = pol.Header
		if e.HeaderFunc != nil {
			if h := e.HeaderFunc(pol.Header); h != "" {
				v = h
			}
		}
	}
	switch s := v.(type) {
	case nil:
		if named := e.Fields.Named(); len(named) > 0 {
			return "", field, true, &rule.InvalidError{Field: field, Reason: fmt.Sprintf(
				"is required: the tenant's end-user policy names end users by %s, and this request names one by %s instead (send it as %s, or have the policy's source changed)",
				field, strings.Join(named, " and "), field)}
		}
		return "", field, false, nil
	case string:
		return s, field, true, rule.ValidateEndUserID(field, s)
	default:
		return "", field, true, &rule.InvalidError{Field: field, Reason: "must be a string (it names the end user)"}
	}
}

// maxEndUserCache bounds a replica's (tenant, end user) -> tenant id
// entries. Past it the cache starts over: a miss costs one short
// transaction (EndUserEnsure), never a wrong answer, since the id is a
// function of the pair and a stale entry of an expired end user is caught
// by the decision (rule.ErrEndUserExpired).
const maxEndUserCache = 100_000

// endUserCapWait is how long a replica answers ErrEndUserCap for an end
// user the store refused at its tenant's cap, without asking again: a
// refused end user's every request would otherwise be a transaction on
// its tenant's lock. A slot freed meanwhile (an expiry, a larger cap) is
// seen after it.
const endUserCapWait = time.Second

// endUserCache remembers the end users this replica has resolved, those
// the cap refused lately, and the resolutions in flight (concurrent first
// sights of one end user on a replica make one transaction).
type endUserCache struct {
	mu       sync.Mutex
	m        map[string]string
	capped   map[string]time.Time
	inFlight map[string]*ensuring
}

// ensuring is one EndUserEnsure in flight, which callers of the same end
// user wait for.
type ensuring struct {
	done  chan struct{}
	child string
	err   error
}

func (c *endUserCache) get(key string) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	id, ok := c.m[key]
	return id, ok
}

func (c *endUserCache) forget(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, key)
}

// ensure resolves key through fn, once for all the callers that ask at
// the same time, remembering the answer (or a refusal at the cap).
func (c *endUserCache) ensure(key string, fn func() (string, error)) (string, error) {
	c.mu.Lock()
	if at, ok := c.capped[key]; ok {
		if time.Since(at) < endUserCapWait {
			c.mu.Unlock()
			return "", rule.ErrEndUserCap
		}
		delete(c.capped, key)
	}
	if e, ok := c.inFlight[key]; ok {
		c.mu.Unlock()
		<-e.done
		return e.child, e.err
	}
	e := &ensuring{done: make(chan struct{})}
	if c.inFlight == nil {
		c.inFlight = map[string]*ensuring{}
	}
	c.inFlight[key] = e
	c.mu.Unlock()

	e.child, e.err = fn()

	c.mu.Lock()
	delete(c.inFlight, key)
	switch {
	case e.err == nil && e.child != "":
		if c.m == nil || len(c.m) >= maxEndUserCache {
			c.m = make(map[string]string)
		}
		c.m[key] = e.child
	case errors.Is(e.err, rule.ErrEndUserCap):
		if c.capped == nil || len(c.capped) >= maxEndUserCache {
			c.capped = make(map[string]time.Time)
		}
		c.capped[key] = time.Now()
	}
	c.mu.Unlock()
	close(e.done)
	return e.child, e.err
}

// endUser resolves the end user a request names, when its tenant has an
// end-user policy and the request gives an id from the policy's source:
// the end user's tenant id (created on first sight, or revived, by
// account.Store.EndUserEnsure; the cap applies), or "" to decide as the
// tenant's own. A tenant without a policy costs a map lookup. While the
// store is down nothing is resolved: the request is the tenant's, and its
// failure policy applies as it would. fresh skips the cache (an end user
// found expired). It returns an *InvalidError (a bad id),
// rule.ErrEndUserCap, or the store's error.
func (a *Admitter) endUser(ctx context.Context, req *Request, fresh bool) (string, error) {
	pol := a.endUserPolicy(ctx, req.TenantID)
	if pol == nil {
		return "", nil
	}
	id, _, present, err := req.EndUser.id(pol)
	if !present || err != nil {
		return "", err
	}
	key := req.TenantID + "\x00" + id
	if fresh {
		a.endUsers.forget(key)
	} else if child, ok := a.endUsers.get(key); ok {
		return child, nil
	}
	parent := req.TenantID
	child, err := a.endUsers.ensure(key, func() (string, error) {
		// Not the caller's ctx: callers of the same end user share this.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), a.cfg.StoreTimeout)
		defer cancel()
		child, err := a.cfg.Store.EndUserEnsure(ctx, parent, id)
		if errors.Is(err, rule.ErrNoEndUserPolicy) {
			return "", nil // deleted since this replica read it
		}
		return child, err
	})
	if errors.Is(err, rule.ErrUnavailable) && !errors.Is(err, rule.ErrOutcomeUnknown) {
		a.MarkDown(err)
	}
	return child, err
}

// endUserPolicy is the tenant's end-user policy, nil for none, and nil
// while the store is down or when this replica could not read any copy of
// the policies yet (account.Store.EndUserPolicyOf): the request is then
// decided as the tenant's own, which finds the outage, if there is one,
// and applies the failure policy as for any request. (A store that is up
// but failed that one read decides one request as the tenant's: its bound
// holds, its end user's is not consulted.)
func (a *Admitter) endUserPolicy(ctx context.Context, tenantID string) *account.EndUserPolicy {
	if a.Down() {
		return nil
	}
	pol, err := a.cfg.Store.EndUserPolicyOf(ctx, tenantID) // bounds its own refresh
	if err != nil {
		return nil
	}
	return pol
}

// endUserOfAdmission is the tenant a settle or release by id of tenantID
// is decided as: the end user of tenantID whose admission it names, else
// tenantID (one read, only when the tenant has an end-user policy). A face
// that authenticated the tenant's key settles its end users' admissions by
// id without knowing them.
func (a *Admitter) endUserOfAdmission(ctx context.Context, tenantID, admissionID string) (string, error) {
	if admissionID == "" || a.endUserPolicy(ctx, tenantID) == nil {
		return tenantID, nil
	}
	ctx, cancel := context.WithTimeout(ctx, a.cfg.StoreTimeout)
	defer cancel()
	child, err := a.cfg.Store.EndUserAdmissionTenant(ctx, tenantID, admissionID)
	if err != nil || child == "" {
		return tenantID, err
	}
	return child, nil
}

// reserveEndUser decides req as the end user it names (endUser), and says
// whether it did (false: the request is its tenant's own, to decide as
// usual). An end user found expired by the decision (it idled out since
// this replica resolved it) is revived, the cap applying, and decided
// again, once.
func (a *Admitter) reserveEndUser(ctx context.Context, req Request) (r *account.Reservation, local, asEndUser bool, err error) {
	child, err := a.endUser(ctx, &req, false)
	switch {
	case err != nil:
		return nil, false, true, err
	case child == "":
		return nil, false, false, nil
	}
	parent := req.TenantID
	req.TenantID = child
	r, local, err = a.reserve(ctx, req)
	if !errors.Is(err, rule.ErrEndUserExpired) {
		return r, local, true, err
	}
	req.TenantID = parent
	if child, err = a.endUser(ctx, &req, true); err != nil {
		return nil, false, true, err
	}
	if child != "" { // else its policy is gone: the tenant's own
		req.TenantID = child
	}
	r, local, err = a.reserve(ctx, req)
	if errors.Is(err, rule.ErrEndUserExpired) {
		// Expired again in between (a sweep each time): rare, and retrying
		// succeeds, as for a busy store.
		err = fmt.Errorf("%w: the end user expired while it was decided", rule.ErrBusy)
	}
	return r, local, true, err
}
