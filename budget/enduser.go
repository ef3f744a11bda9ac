package budget

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
//     with ErrEndUserExpired until EndUserEnsure revives it (cap applies).

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/base32"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

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

// End-user errors.
var (
	// ErrEndUserCap: the tenant has as many live end users as its policy
	// allows, so a new one (or an expired one seen again) is refused. It
	// is a request's own outcome (429 end_user_cap on every face), and it
	// consumes nothing.
	ErrEndUserCap = errors.New("budget: the tenant has as many end users as its end-user policy allows")
	// ErrEndUserExpired: a reserve named an end user that idled out since
	// this replica resolved it; EndUserEnsure revives it (admission does,
	// and decides again).
	ErrEndUserExpired = errors.New("budget: the end user expired; ensure it again")
	// ErrNoEndUserPolicy: the tenant has no end-user policy.
	ErrNoEndUserPolicy = errors.New("budget: the tenant has no end-user policy")
)

// EndUserSource is where a request names its end user.
type EndUserSource string

// The sources of end-user ids.
const (
	// SourceUser is OpenAI's `user` body field; on Anthropic's Messages
	// wire, its one end-user field, `metadata.user_id`
	// (estimator.EndUserFields.Field).
	SourceUser EndUserSource = "user"
	// SourceSafetyIdentifier is OpenAI's `safety_identifier` body field;
	// on Anthropic's Messages wire, `metadata.user_id`.
	SourceSafetyIdentifier EndUserSource = "safety_identifier"
	// SourceMetadataUserID is Anthropic's `metadata.user_id` body field.
	SourceMetadataUserID EndUserSource = "metadata.user_id"
	// SourceHeader is an HTTP header, named by the policy.
	SourceHeader EndUserSource = "header"
)

// MaxEndUserIDLen is the longest end-user id, in bytes.
const MaxEndUserIDLen = 256

// MaxEndUsersCap bounds a policy's max_end_users: a template change is
// applied to every live end user in one transaction.
const MaxEndUsersCap = 100_000

// EndUserPolicyRefresh is how stale a replica's copy of the end-user
// policies may be: a policy written through another replica applies
// within it (one written through this replica's store applies at once).
// Until then, requests of a tenant whose policy is new are decided as the
// tenant's own; of a deleted policy, as end users that exist already
// (a new one is refused ErrNoEndUserPolicy by EndUserEnsure and decided as
// the tenant's).
const EndUserPolicyRefresh = 5 * time.Second

// EndUserPolicy is a tenant's end-user policy.
type EndUserPolicy struct {
	TenantID string
	Source   EndUserSource
	// Header names the header of SourceHeader (canonical form).
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
	Source      EndUserSource
	Header      string
	Template    rule.Limits
	MaxEndUsers int
	IdleTTL     time.Duration
	Actor       string
}

// check validates p, filling the template's defaults; it returns a
// *LimitError naming the field.
func (p *EndUserPolicyParams) check() error {
	switch p.Source {
	case SourceUser, SourceSafetyIdentifier, SourceMetadataUserID:
		if p.Header != "" {
			return &rule.LimitError{Field: "header", Reason: `is set only with source "header"`}
		}
	case SourceHeader:
		if !validHeaderName(p.Header) {
			return &rule.LimitError{Field: "header", Reason: "must be an HTTP header name (1-128 token characters)"}
		}
		p.Header = canonicalHeader(p.Header)
	default:
		return &rule.LimitError{Field: "source", Reason: `must be "user", "safety_identifier", "metadata.user_id" or "header"`}
	}
	if err := p.Template.Validate(); err != nil {
		var le *rule.LimitError
		if errors.As(err, &le) {
			return &rule.LimitError{Field: "template." + le.Field, Reason: le.Reason}
		}
		return err
	}
	switch {
	case p.MaxEndUsers <= 0 || p.MaxEndUsers > MaxEndUsersCap:
		return &rule.LimitError{Field: "max_end_users", Reason: fmt.Sprintf("must be between 1 and %d", MaxEndUsersCap)}
	case p.IdleTTL < time.Second || p.IdleTTL > 366*24*time.Hour:
		return &rule.LimitError{Field: "idle_ttl_s", Reason: "must be between 1 and 31622400 seconds (366 days)"}
	}
	return nil
}

// validHeaderName reports whether h is an HTTP field name (RFC 9110 token).
func validHeaderName(h string) bool {
	if h == "" || len(h) > 128 {
		return false
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0 {
			continue
		}
		return false
	}
	return true
}

// canonicalHeader is net/http's canonical form of a header name, so that
// a policy's header reads back as Header.Get finds it.
func canonicalHeader(h string) string {
	b := []byte(strings.ToLower(h))
	upper := true
	for i, c := range b {
		if upper && c >= 'a' && c <= 'z' {
			b[i] = c - 'a' + 'A'
		}
		upper = c == '-'
	}
	return string(b)
}

// EndUserTenantID is the tenant id of the end user endUserID of tenant
// parent: "eu-" and 26 base32 characters of a SHA-256 of both, so that
// every replica names it alike without asking the store, and it fits the
// tenant id pattern whatever the end-user id holds.
func EndUserTenantID(parent, endUserID string) string {
	h := sha256.Sum256([]byte(parent + "\x00" + endUserID))
	enc := base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(h[:])
	return "eu-" + strings.ToLower(enc[:26])
}

// ValidateEndUserID checks an end-user id as a request gave it from
// field: 1 to MaxEndUserIDLen bytes of UTF-8 without control characters.
// It returns an *InvalidError naming field.
func ValidateEndUserID(field, id string) error {
	switch {
	case id == "":
		return &rule.InvalidError{Field: field, Reason: "must not be empty (it names the end user)"}
	case len(id) > MaxEndUserIDLen:
		return &rule.InvalidError{Field: field, Reason: fmt.Sprintf("must be at most %d bytes", MaxEndUserIDLen)}
	case !utf8.ValidString(id):
		return &rule.InvalidError{Field: field, Reason: "must be valid UTF-8"}
	case strings.IndexFunc(id, unicode.IsControl) >= 0:
		return &rule.InvalidError{Field: field, Reason: "must not contain control characters"}
	}
	return nil
}

// LimitsJSON is l as JSON, in the one shape limits have in ledger details
// and end-user templates (the admin API's limit field names).
func LimitsJSON(l rule.Limits) json.RawMessage {
	b, _ := json.Marshal(detailOf(l)) // plain fields: cannot fail
	return b
}

// limitsOf reads limits back from their detail shape (detailOf).
func limitsOf(d limitsDetail) (rule.Limits, error) {
	l := rule.Limits{
		TokensCapacity:     d.TokensCapacity,
		RequestsCapacity:   d.RequestsCapacity,
		MaxConcurrent:      d.MaxConcurrent,
		PeriodBudget:       d.PeriodBudget,
		Period:             rule.Period(d.Period),
		ReservationTTL:     time.Duration(d.ReservationTTLMilli) * time.Millisecond,
		MaxWait:            time.Duration(d.MaxWaitMilli) * time.Millisecond,
		OnStoreUnavailable: rule.Policy(d.OnStoreUnavailable),
	}
	var err error
	if l.TokensRateMicro, err = rule.ParseRate(d.TokensPerSecond); err != nil {
		return l, fmt.Errorf("budget: limits: tokens_per_second: %w", err)
	}
	if d.RequestsPerSecond != "" {
		if l.RequestsRateMicro, err = rule.ParseRate(d.RequestsPerSecond); err != nil {
			return l, fmt.Errorf("budget: limits: requests_per_second: %w", err)
		}
	}
	if l.Shadow, err = rule.ParseLimitSet("shadow", d.Shadow); err != nil {
		return l, err
	}
	if len(d.Windows) > 0 {
		// A stored template: its zones load as StoredZone reads them.
		if l.Windows, err = rule.ParseWindowsWith(d.Windows, rule.StoredZone); err != nil {
			return l, err
		}
	}
	return l, nil
}

// sameLimits reports whether a and b are the same limits, by their one
// JSON shape (so that a field added to Limits is compared too).
func sameLimits(a, b rule.Limits) bool { return string(LimitsJSON(a)) == string(LimitsJSON(b)) }

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
	var d limitsDetail
	if err := json.Unmarshal(r.Template, &d); err != nil {
		return nil, fmt.Errorf("budget: end-user template of %s: %w", r.TenantID, err)
	}
	l, err := limitsOf(d)
	if err != nil {
		return nil, fmt.Errorf("budget: end-user template of %s: %w", r.TenantID, err)
	}
	return &EndUserPolicy{TenantID: r.TenantID, Source: EndUserSource(r.Source), Header: deref0(r.Header), Template: l,
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
	Source      EndUserSource `json:"source"`
	Header      string        `json:"header,omitempty"`
	Template    limitsDetail  `json:"template"`
	MaxEndUsers int           `json:"max_end_users"`
	IdleTTLS    int64         `json:"idle_ttl_s"`
}

func policyDetailOf(p *EndUserPolicy) *policyDetail {
	if p == nil {
		return nil
	}
	return &policyDetail{Source: p.Source, Header: p.Header, Template: detailOf(p.Template), MaxEndUsers: p.MaxEndUsers,
		IdleTTLS: int64(p.IdleTTL / time.Second)}
}

// EndUserPolicySet writes a tenant's end-user policy under the tenant's
// row lock, with a limits entry (the policy before and after) in the
// tenant's chain. When the template changes, every live end user gets the
// new limits in the same transaction, each under its own lock with its
// limits entry (as UpdateLimits would write it): one transaction, so a
// template change is all or nothing, and its size is bounded by the cap
// (MaxEndUsersCap). Expired end users get the template when revived. A
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
	if before != nil && !sameLimits(before.Template, after.Template) {
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
		if after.Source == SourceHeader {
			header = &after.Header
		}
		w.statement(1, endUserPolicyPutSQL, after.TenantID, string(after.Source), header, LimitsJSON(after.Template),
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
// requests are decided as its own. It returns ErrNoEndUserPolicy or
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
		return ErrNoEndUserPolicy
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
// returns ErrNoEndUserPolicy.
func (s *Store) EndUserPolicyGet(ctx context.Context, tenantID string) (*EndUserPolicy, error) {
	var p *EndUserPolicy
	err := retry(ctx, func() error {
		var err error
		p, err = scanPolicy(s.pool.Query(ctx, endUserPolicyGetSQL, tenantID))
		return classify(err, false, false)
	})
	if err == nil && p == nil {
		err = ErrNoEndUserPolicy
	}
	return p, err
}

// policyCache is a replica's copy of every end-user policy, by tenant.
type policyCache struct {
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
func (s *Store) loadPolicies(ctx context.Context) (*policyCache, error) {
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
	c := &policyCache{at: at, byTenant: make(map[string]*EndUserPolicy, len(rs))}
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

// endUserCache holds the store's copy of the policies (EndUserPolicyOf).
type endUserCache struct {
	endUserPolicies   atomic.Pointer[policyCache]
	endUserRefreshing atomic.Bool
	endUserLoading    sync.Mutex
	endUserFailed     *failedRead  // the last first read's failure, under endUserLoading
	endUserSwept      atomic.Int64 // unix nanoseconds of the last idle sweep (endUserSweepDue)
}

// failedRead is a read that failed, and when.
type failedRead struct {
	at  time.Time
	err error
}

// EndUserEnsure returns the tenant id of the end user endUserID of tenant
// parent (EndUserTenantID), creating it from the parent's template on
// first sight, or reviving it if it expired, in one short transaction
// that holds the parent's lock (with its ancestors', root first, and the
// end user's when it exists, as a decision takes them): concurrent first
// sights of one end user from any replicas make exactly one row, and the
// live end users never exceed the policy's cap. A created end user's
// first entry is its tenant entry (kind tenant, event created, as
// CreateTenant writes); a revival keeps the end user's balances and chain
// and appends a tenant entry (event revived), after a limits entry if the
// template changed while it was expired. It returns ErrEndUserCap,
// ErrNoEndUserPolicy, ErrTenantNotFound, ErrTenantDisabled (the tenant or
// an ancestor is: it would admit nothing), or an *InvalidError (a bad id).
func (s *Store) EndUserEnsure(ctx context.Context, parent, endUserID string) (string, error) {
	if err := ValidateEndUserID("end_user", endUserID); err != nil {
		return "", err
	}
	childID := EndUserTenantID(parent, endUserID)
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
		return "", ErrNoEndUserPolicy
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
		return "", ErrEndUserCap
	}
	w := &writes{}
	if c != nil {
		c.advance(now)
		if !sameLimits(c.Limits, pol.Template) {
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
			Event   string       `json:"event"`
			Parent  string       `json:"parent"`
			EndUser string       `json:"end_user"`
			Limits  limitsDetail `json:"limits"`
		}{"created", parent, endUserID, detailOf(pol.Template)})
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
