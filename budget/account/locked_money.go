package account

import (
	"time"

	"github.com/tokengate/tokengate/budget/rule"
)

// LockedMoney is what a change beside the store (a batch, issue 38) counts
// in its tenant's money windows, at every level of its tree, as an
// admission's money is counted: a reserve is taken when the change is
// made, refused where an enforced money window cannot hold it; an end
// corrects each window by actual - estimate, and a refund gives back only
// what was taken from the window's current span (rule.TenantState's
// EndExcept). It moves no token bucket, request bucket nor open slot: a
// batch is admitted by its allowance, and only its money shares the
// tenant's budget.
type LockedMoney struct {
	// Reserve is money taken now (micro-units of Currency).
	Reserve int64
	// End: Estimate (reserved at ReservedAt) ends as Actual (0: refunded).
	End              bool
	Estimate, Actual int64
	ReservedAt       time.Time
	// Currency names the money in a refusal.
	Currency string
	// Unpriced is a model the reserve names that has no price: refused
	// where a money window must count it (rule.RequirePrice), as an
	// admission of it would be.
	Unpriced string
}

// moneySkip is the skip set of a LockedMoney: every limit but the windows.
func moneySkip() rule.LimitSet {
	return rule.LimitSet(0).With(rule.LimitTokens).With(rule.LimitRequests).With(rule.LimitConcurrency)
}

// applyMoney applies m to every level of chain (root first) at now: the
// reserve's refusal, if an enforced money window of any level cannot hold
// it (the one that resets last, as an admission's), else its debit; or the
// end's correction. A shadowed period budget counts the money but never
// refuses it: a batch is not one request the shadow report could name. It
// returns the refusal (a *rule.BudgetExhaustedError or a
// *rule.TooLargeError), rule.RequirePrice's error, or an
// *rule.OverflowError, with nothing changed.
func applyMoney(chain []*tenant, m LockedMoney, now time.Time) error {
	for _, lv := range chain {
		lv.advance(now)
	}
	skip := moneySkip()
	if !m.End {
		if m.Unpriced != "" {
			for _, lv := range chain {
				if err := rule.RequirePrice(m.Unpriced, lv.id, lv.Limits); err != nil {
					return err
				}
			}
		}
		var refusal error
		var resets time.Duration
		for i := len(chain) - 1; i >= 0; i-- {
			lv := chain[i]
			if lv.Limits.Shadow.Has(rule.LimitPeriodBudget) {
				continue
			}
			for _, err := range rule.Refusals(lv.TenantState, rule.Amount{Money: m.Reserve}, now) {
				switch e := err.(type) {
				case *rule.TooLargeError:
					if e.Limit == rule.LimitPeriodBudget && e.Counts == rule.CountMoney {
						e.Level = lv.id
						return e
					}
				case *rule.BudgetExhaustedError:
					if e.Counts == rule.CountMoney && (refusal == nil || e.RetryAfter > resets) {
						e.Level, e.Currency = lv.id, m.Currency
						refusal, resets = e, e.RetryAfter
					}
				}
			}
		}
		if refusal != nil {
			return refusal
		}
	}
	// Every level's new state is computed before any is kept, so that an
	// overflow at one level leaves all as they were.
	after := make([]rule.TenantState, len(chain))
	for i, lv := range chain {
		st := lv.TenantState
		st.Windows = append([]rule.WindowUsage(nil), lv.TenantState.Windows...)
		var err error
		if m.End {
			_, err = st.EndExcept(rule.Amount{Money: m.Estimate}, rule.Amount{Money: m.Actual}, m.ReservedAt, true, skip)
		} else {
			_, err = st.DebitExcept(rule.Amount{Money: m.Reserve}, skip)
		}
		if err != nil {
			return err
		}
		after[i] = st
	}
	for i, lv := range chain {
		lv.TenantState = after[i]
	}
	return nil
}
