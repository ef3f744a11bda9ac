package rule

import (
	"strings"
	"time"
)

// MaxDepth is how many levels budgets nest: an organisation, its teams,
// their projects and the key-level tenants below them.
const MaxDepth = 4

// ShadowRefusal is a shadow limit that would have refused a request: the
// tenant (level of the tree) whose limit it is, and the limit.
type ShadowRefusal struct {
	Level string `json:"level"`
	Limit Limit  `json:"limit"`
}

// Level is one level of a tenant's tree as a decision reads it: the
// tenant's id, its state (locked, refilled to now), and its limits of the
// request's model (nil for none).
type Level struct {
	ID    string
	State *TenantState
	Model *ModelState
}

// DecideLevels is the admission decision over a tree: a request of amount
// a (with in input and out output tokens, for the model limits) must fit
// every level (root first, the caller's tenant last). A level's shadow
// limit that would refuse is recorded (shadow) and left out of that
// level's debit (skips, one set per level), but refuses nothing; a shadow
// flag of a level's model limits is the model's, not the tenant's. Of the
// enforced refusals, the one returned names its level: a request too large
// for some level first (it can never fit), else, of each level's first
// refusing limit (in the contract's order; an exhausted window whose reset
// is later than that limit's wait, before it), the one that lasts longest,
// since the request fits only when every level does (nearest the caller's
// tenant on a tie). holdbackMicro is taken from the caller's own tenant
// before deciding: callers queued ahead of it there are served first. It
// changes no level's state.
func DecideLevels(levels []Level, a Amount, in, out, holdbackMicro int64, now time.Time) (skips []LimitSet, shadow []ShadowRefusal, refusal error) {
	skips = make([]LimitSet, len(levels))
	var tooLarge *TooLargeError
	var rejected *RejectedError
	var rejectedErr error // rejected, or the *BudgetExhaustedError that embeds it
	for i := len(levels) - 1; i >= 0; i-- {
		lv := levels[i]
		st := *lv.State
		if i == len(levels)-1 {
			st.Tokens.BalanceMicro -= max(0, holdbackMicro)
		}
		refusals := Refusals(st, a, now)
		shadowSet := st.Limits.Shadow
		if m := lv.Model; m != nil {
			refusals = append(refusals, m.Refusals(in, out)...)
			shadowSet |= m.Shadow
		}
		var levelRejected *RejectedError // the level's first refusing limit, in the contract's order
		var levelErr error               // levelRejected, or the *BudgetExhaustedError that embeds it
		for _, err := range refusals {
			lim := LimitOf(err)
			if shadowSet.Has(lim) {
				if !skips[i].Has(lim) {
					shadow = append(shadow, ShadowRefusal{Level: lv.ID, Limit: lim})
				}
				skips[i] = skips[i].With(lim)
				continue
			}
			switch e := err.(type) {
			case *TooLargeError:
				if tooLarge == nil {
					e.Level = lv.ID
					tooLarge = e
				}
			case *RejectedError:
				if levelRejected == nil {
					e.Level = lv.ID
					levelRejected, levelErr = e, e
				}
			case *BudgetExhaustedError:
				// An exhausted window binds until its reset: named before a
				// bucket that refills sooner, which would send the caller
				// back, after a short wait, to this same refusal.
				if levelRejected == nil || e.RetryAfter > levelRejected.RetryAfter {
					e.Level = lv.ID
					levelRejected, levelErr = &e.RejectedError, e
				}
			}
		}
		if levelRejected != nil && (rejected == nil || levelRejected.RetryAfter > rejected.RetryAfter) {
			rejected, rejectedErr = levelRejected, levelErr
		}
	}
	switch {
	case tooLarge != nil:
		return skips, shadow, tooLarge
	case rejected != nil:
		return skips, shadow, rejectedErr
	}
	return skips, shadow, nil
}

// Shadowed is how an admission records the limits its debit left out:
// "tenant:limit" for each level's skipped limits (skips, one set per level
// of ids, as DecideLevels returns them).
func Shadowed(ids []string, skips []LimitSet) []string {
	var out []string
	for i, s := range skips {
		for _, l := range s.Limits() {
			out = append(out, ids[i]+":"+string(l))
		}
	}
	return out
}

// SkipOf reads back, for one level, what Shadowed recorded: the limits
// the admission's debit left out there, which its end leaves out too.
func SkipOf(shadowed []string, level string) LimitSet {
	var s LimitSet
	for _, x := range shadowed {
		if id, l, ok := strings.Cut(x, ":"); ok && id == level {
			s = s.With(Limit(l))
		}
	}
	return s
}
