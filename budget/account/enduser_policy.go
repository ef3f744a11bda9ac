package account

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
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/ledger"
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
