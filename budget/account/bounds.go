package account

import (
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

// SettleBounds is the bound of a settle of an admission that reserved e
// (rule.UsageBounds), with the window of e's model read from t: its widest
// context window, since a call of a model that offers Anthropic's
// 1M-context beta may have carried it (estimator.Model.WidestContextWindow)
// and an admission does not record whether it did. A model t does not
// know is held to rule.MaxUnknownModelUsage. A nil t is the seeded table.
// It is the glue between the estimator's table and the rule, which knows
// no models; the store's settles, the outage's local ones and the proxy's
// clamp all judge usage with it.
func SettleBounds(e estimator.Estimate, t *estimator.Table) rule.UsageBound {
	if t == nil {
		t = estimator.DefaultTable()
	}
	window := int64(rule.MaxUnknownModelUsage)
	if m, known := t.Lookup(e.Model); known {
		window = m.WidestContextWindow()
	}
	return rule.UsageBounds(window, e.InputTokens, e.OutputTokens)
}

// WithModels gives the store the model table that bounds settles' usage
// (the estimator's, which admins may change at run time), and returns it.
// Without it the seeded table applies.
func (s *Store) WithModels(table func() *estimator.Table) *Store {
	s.modelsFunc = table
	return s
}

func (s *Store) modelTable() *estimator.Table {
	if s.modelsFunc == nil {
		return nil
	}
	return s.modelsFunc()
}
