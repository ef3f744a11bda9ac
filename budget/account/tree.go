package account

import (
	"fmt"

	"strings"
	"time"

	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

// chainOf is t's ancestors and t, root first, from a batch's locked rows
// (lockTenants locks every ancestor of the tenants it is given).
func chainOf(ts map[string]*tenant, t *tenant) ([]*tenant, error) {
	chain := make([]*tenant, 0, len(t.path)+1)
	for _, id := range t.path {
		a, ok := ts[id]
		if !ok {
			return nil, fmt.Errorf("budget: tenant %s: its ancestor %s was not locked", t.id, id)
		}
		chain = append(chain, a)
	}
	return append(chain, t), nil
}

// decideLevels is the admission decision over a tree: a request costing
// cost must fit every level of chain (root first, the caller's tenant
// last). A level's shadow limit that would refuse is recorded (shadow) and
// left out of that level's debit (skips, one set per level of chain), but
// refuses nothing. Of the enforced refusals, the one returned names its
// level: a request too large for some level first (it can never fit),
// else, of each level's first refusing limit (in the contract's order; an
// exhausted window whose reset is later than that limit's wait, before
// it), the one that lasts longest, since the request fits only when every level
// does (nearest the caller's tenant on a tie). holdback is
// taken from the caller's own tenant before deciding: callers queued ahead
// of it there are served first.
func decideLevels(chain []*tenant, est estimator.Estimate, money int64, holdback int64, now time.Time, models map[[2]string]*modelBucket) (skips []rule.LimitSet, shadow []rule.ShadowRefusal, refusal error) {
	skips = make([]rule.LimitSet, len(chain))
	var tooLarge *rule.TooLargeError
	var rejected *rule.RejectedError
	var rejectedErr error // rejected, or the *BudgetExhaustedError that embeds it
	mkey := ""
	if len(models) > 0 {
		mkey = ModelKey(est)
	}
	for i := len(chain) - 1; i >= 0; i-- {
		lv := chain[i]
		st := lv.TenantState
		if i == len(chain)-1 {
			st.Tokens.BalanceMicro -= max(0, holdback)
		}
		refusals := rule.Refusals(st, rule.Amount{Cost: est.Cost, Money: money}, now)
		shadowSet := lv.Limits.Shadow
		if m := models[[2]string{lv.id, mkey}]; m != nil {
			// The model's own limits at this level: a shadow flag of the
			// model's buckets is the model's, not the tenant's.
			refusals = append(refusals, m.Refusals(est.InputTokens, est.OutputTokens)...)
			shadowSet |= m.Shadow
		}
		var levelRejected *rule.RejectedError // the level's first refusing limit, in the contract's order
		var levelErr error                    // levelRejected, or the *BudgetExhaustedError that embeds it
		for _, err := range refusals {
			lim := rule.LimitOf(err)
			if shadowSet.Has(lim) {
				if !skips[i].Has(lim) {
					shadow = append(shadow, rule.ShadowRefusal{Level: lv.id, Limit: lim})
				}
				skips[i] = skips[i].With(lim)
				continue
			}
			switch e := err.(type) {
			case *rule.TooLargeError:
				if tooLarge == nil {
					e.Level = lv.id
					tooLarge = e
				}
			case *rule.RejectedError:
				if levelRejected == nil {
					e.Level = lv.id
					levelRejected, levelErr = e, e
				}
			case *rule.BudgetExhaustedError:
				// An exhausted window binds until its reset: named before a
				// bucket that refills sooner, which would send the caller
				// back, after a short wait, to this same refusal.
				if levelRejected == nil || e.RetryAfter > levelRejected.RetryAfter {
					e.Level = lv.id
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

// shadowedOf is how an admission records the limits its debit left out:
// "tenant:limit" for each level's skipped limits.
func shadowedOf(chain []*tenant, skips []rule.LimitSet) []string {
	var out []string
	for i, s := range skips {
		for _, l := range s.Limits() {
			out = append(out, chain[i].id+":"+string(l))
		}
	}
	return out
}

// skipOf reads back, for one level, what shadowedOf recorded.
func skipOf(shadowed []string, level string) rule.LimitSet {
	var s rule.LimitSet
	for _, x := range shadowed {
		if id, l, ok := strings.Cut(x, ":"); ok && id == level {
			s = s.With(rule.Limit(l))
		}
	}
	return s
}

// anyDisabled reports whether some level of chain is disabled: a disabled
// organisation admits nothing for any of its teams.
func anyDisabled(chain []*tenant) bool {
	for _, lv := range chain {
		if lv.disabled {
			return true
		}
	}
	return false
}

// shadowReason is the ledger's note on an entry whose debit (or its
// correction) left out shadow limits: an auditor sees why the delta is 0.
func shadowReason(skip rule.LimitSet) string {
	if skip == 0 {
		return ""
	}
	return "shadow limits that would have refused: " + strings.Join(skip.Strings(), ", ")
}

// joinReason joins an entry's reasons ("" for none).
func joinReason(reasons ...string) string {
	var out []string
	for _, r := range reasons {
		if r != "" {
			out = append(out, r)
		}
	}
	return strings.Join(out, "; ")
}

// joinDetail makes an entry's detail of the fields that model buckets and
// pools record ("" for none).
func joinDetail(fields []string) string {
	if len(fields) == 0 {
		return ""
	}
	return "{" + strings.Join(fields, ",") + "}"
}
