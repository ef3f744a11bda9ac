package rule

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Model scopes (issue 38): which models a tenant, and each of its keys, may
// use. A scope is a list of entries, each an exact model name or a simple
// glob whose '*' matches any run of characters (claude-*, gpt-4o*); an
// empty list allows every model. A request's model must pass every scope
// on its way: its key's, its tenant's and each ancestor's, so a key
// narrows its tenant and a child narrows its parent, and nothing below a
// tenant can widen what the tenant may use.

// ErrModelNotAllowed is wrapped by *ModelNotAllowedError.
var ErrModelNotAllowed = errors.New("budget: model not allowed")

// LimitModelScope is the limit that refuses a model outside a scope, as
// tokengate_admissions_total labels it.
const LimitModelScope Limit = "model_scope"

// MaxModelScope bounds a scope's entries, and MaxModelEntry each entry's
// length: a scope is read with every decision of its tenant.
const (
	MaxModelScope = 100
	MaxModelEntry = 200
)

// ModelNotAllowedError says which scope refused a request's model. It is a
// refusal of policy, the same whatever the balances: retrying never helps.
type ModelNotAllowedError struct {
	// Model is the model the request named, and Field where it named it
	// ("model" for a call, "line N: body.model" for a batch line).
	Model, Field string
	// Scope is what refused it: "key" (the request's key) or "tenant", and
	// Level the tenant whose list refused (the caller's, or an ancestor).
	Scope, Level string
}

func (e *ModelNotAllowedError) Error() string {
	return fmt.Sprintf("budget: model %q (%s) is not allowed for this %s", e.Model, e.fieldOr(), e.Scope)
}

// Unwrap makes errors.Is(err, ErrModelNotAllowed) hold.
func (e *ModelNotAllowedError) Unwrap() error { return ErrModelNotAllowed }

func (e *ModelNotAllowedError) fieldOr() string {
	if e.Field == "" {
		return "model"
	}
	return e.Field
}

// Message says which scope refused the model, for a face's error body:
// the same words in every face's error shape.
func (e *ModelNotAllowedError) Message() string {
	who := "this API key"
	if e.Scope == "tenant" {
		who = "tenant " + e.Level
	}
	return fmt.Sprintf("the model %q (%s) is not one %s may use; nothing was charged", e.Model, e.fieldOr(), who)
}

// FieldOr is the field that named the model ("model" when unset).
func (e *ModelNotAllowedError) FieldOr() string { return e.fieldOr() }

// ModelMatches reports whether model matches one scope entry: equal, or,
// for an entry with '*', matching it where each '*' stands for any run of
// characters (none included). Nothing else is special: a model name may
// hold '/', '.', '?' or '[' (Vertex's publishers/..., fine-tunes).
func ModelMatches(entry, model string) bool {
	if !strings.Contains(entry, "*") {
		return entry == model
	}
	parts := strings.Split(entry, "*")
	if !strings.HasPrefix(model, parts[0]) {
		return false
	}
	rest := model[len(parts[0]):]
	last := parts[len(parts)-1]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(rest, p)
		if i < 0 {
			return false
		}
		rest = rest[i+len(p):]
	}
	return len(rest) >= len(last) && strings.HasSuffix(rest, last)
}

// ModelsAllow reports whether a scope allows model: an empty scope allows
// every model, else one entry must match it.
func ModelsAllow(scope []string, model string) bool {
	if len(scope) == 0 {
		return true
	}
	for _, e := range scope {
		if ModelMatches(e, model) {
			return true
		}
	}
	return false
}

// NormalizeModels validates a scope as an administrator gave it and
// returns it in the form stored: entries trimmed, duplicates dropped,
// order kept. It returns a *LimitError (field "models") for an empty
// entry, one with white space or control characters, one longer than
// MaxModelEntry, or more than MaxModelScope entries. Nil or empty: every
// model.
func NormalizeModels(scope []string) ([]string, error) {
	out := make([]string, 0, len(scope))
	for i, e := range scope {
		e = strings.TrimSpace(e)
		switch {
		case e == "":
			return nil, &LimitError{"models", fmt.Sprintf("entry %d is empty", i)}
		case len(e) > MaxModelEntry:
			return nil, &LimitError{"models", fmt.Sprintf("entry %d is longer than %d characters", i, MaxModelEntry)}
		case strings.ContainsFunc(e, func(r rune) bool { return r <= ' ' || r == 0x7f }):
			return nil, &LimitError{"models", fmt.Sprintf("entry %d (%q) holds white space or a control character", i, e)}
		}
		if !slices.Contains(out, e) {
			out = append(out, e)
		}
	}
	if len(out) > MaxModelScope {
		return nil, &LimitError{"models", fmt.Sprintf("at most %d entries", MaxModelScope)}
	}
	return out, nil
}

// ScopeLevel is one tenant's scope on a request's way, root first.
type ScopeLevel struct {
	TenantID string
	Models   []string
}

// CheckModelScopes is the one rule every face's admission follows: the
// model must pass each tenant's scope of its budget tree (root first) and
// then its key's (nil for a request without a key, as through a gateway).
// It returns a *ModelNotAllowedError naming the first scope
// that refuses, or nil.
func CheckModelScopes(model, field string, levels []ScopeLevel, keyModels []string) error {
	for _, lv := range levels {
		if !ModelsAllow(lv.Models, model) {
			return &ModelNotAllowedError{Model: model, Field: field, Scope: "tenant", Level: lv.TenantID}
		}
	}
	if !ModelsAllow(keyModels, model) {
		return &ModelNotAllowedError{Model: model, Field: field, Scope: "key"}
	}
	return nil
}
