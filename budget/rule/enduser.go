package rule

// End users (issue 25) as values: where a request names its end user, the
// id's rules, the tenant id every replica derives from it, and a policy's
// bounds. The store (budget/account) keeps the policies and the end users'
// rows.

import (
	"crypto/sha256"
	"encoding/base32"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// End-user errors.
var (
	// ErrEndUserCap: the tenant has as many live end users as its policy
	// allows, so a new one (or an expired one seen again) is refused. It
	// is a request's own outcome (429 end_user_cap on every face), and it
	// consumes nothing.
	ErrEndUserCap = errors.New("budget: the tenant has as many end users as its end-user policy allows")
	// ErrEndUserExpired: a reserve named an end user that idled out since
	// this replica resolved it; the store's EndUserEnsure revives it
	// (admission does, and decides again).
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

// CheckEndUserPolicy validates an end-user policy's values, filling the
// template's defaults (Limits.Validate), and returns header in net/http's
// canonical form (so that it reads back as Header.Get finds it; "" unless
// source is SourceHeader). It returns a
// *LimitError naming the field (a template's fields as "template.<field>").
func CheckEndUserPolicy(source EndUserSource, header string, template *Limits, maxEndUsers int, idleTTL time.Duration) (string, error) {
	switch source {
	case SourceUser, SourceSafetyIdentifier, SourceMetadataUserID:
		if header != "" {
			return "", &LimitError{Field: "header", Reason: `is set only with source "header"`}
		}
	case SourceHeader:
		if !validHeaderName(header) {
			return "", &LimitError{Field: "header", Reason: "must be an HTTP header name (1-128 token characters)"}
		}
		header = canonicalHeader(header)
	default:
		return "", &LimitError{Field: "source", Reason: `must be "user", "safety_identifier", "metadata.user_id" or "header"`}
	}
	if err := template.Validate(); err != nil {
		var le *LimitError
		if errors.As(err, &le) {
			return "", &LimitError{Field: "template." + le.Field, Reason: le.Reason}
		}
		return "", err
	}
	switch {
	case maxEndUsers <= 0 || maxEndUsers > MaxEndUsersCap:
		return "", &LimitError{Field: "max_end_users", Reason: fmt.Sprintf("must be between 1 and %d", MaxEndUsersCap)}
	case idleTTL < time.Second || idleTTL > 366*24*time.Hour:
		return "", &LimitError{Field: "idle_ttl_s", Reason: "must be between 1 and 31622400 seconds (366 days)"}
	}
	return header, nil
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
		return &InvalidError{Field: field, Reason: "must not be empty (it names the end user)"}
	case len(id) > MaxEndUserIDLen:
		return &InvalidError{Field: field, Reason: fmt.Sprintf("must be at most %d bytes", MaxEndUserIDLen)}
	case !utf8.ValidString(id):
		return &InvalidError{Field: field, Reason: "must be valid UTF-8"}
	case strings.IndexFunc(id, unicode.IsControl) >= 0:
		return &InvalidError{Field: field, Reason: "must not contain control characters"}
	}
	return nil
}

// ResolvePolicy is a request's failure policy: its model's, else its
// tenant's own, else the replica's default, else reject.
func ResolvePolicy(model, tenant, replica Policy) Policy {
	for _, p := range []Policy{model, tenant, replica} {
		if p != PolicyDefault {
			return p
		}
	}
	return PolicyReject
}
