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

// decideLevels is rule.DecideLevels over a chain of locked tenants (root
// first), each level with its buckets of the estimate's model when it has
// model limits: the glue between the loaded rows and the rule.
func decideLevels(chain []*tenant, est estimator.Estimate, money int64, holdback int64, now time.Time, models map[[2]string]*modelBucket) (skips []rule.LimitSet, shadow []rule.ShadowRefusal, refusal error) {
	mkey := ""
	if len(models) > 0 {
		mkey = ModelKey(est)
	}
	levels := make([]rule.Level, len(chain))
	for i, lv := range chain {
		levels[i] = rule.Level{ID: lv.id, State: &lv.TenantState}
		if m := models[[2]string{lv.id, mkey}]; m != nil {
			levels[i].Model = &m.ModelState
		}
	}
	return rule.DecideLevels(levels, rule.Amount{Cost: est.Cost, Money: money}, est.InputTokens, est.OutputTokens, holdback, now)
}

// shadowedOf is rule.Shadowed of a chain's levels.
func shadowedOf(chain []*tenant, skips []rule.LimitSet) []string {
	ids := make([]string, len(chain))
	for i, lv := range chain {
		ids[i] = lv.id
	}
	return rule.Shadowed(ids, skips)
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

// checkScopes is rule.CheckModelScopes over a chain of locked tenants (root
// first) and the request's key's scope: read in the decision's own
// transaction, under the tenants' row locks that an administrator's change
// of either list takes too, so every admission is checked against the
// lists in effect when it is decided, on every replica.
func checkScopes(chain []*tenant, keyModels []string, model string) error {
	var levels [8]rule.ScopeLevel
	lv := levels[:0]
	for _, t := range chain {
		if len(t.models) > 0 {
			lv = append(lv, rule.ScopeLevel{TenantID: t.id, Models: t.models})
		}
	}
	return rule.CheckModelScopes(model, "model", lv, keyModels)
}
