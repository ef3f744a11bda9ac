package account

import (
	"fmt"

	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

// Money (issue 25): every admission of a model with a price is charged in
// money too, at the price in effect when it was reserved (the price book,
// estimator.PriceBook, read from model_prices). The money is recorded on
// the admission and on every ledger entry it makes, and counted by the
// money windows of its tenant's tree. Its settle is priced at the same row
// of the book, named by the admission (price_model, price_from), so a price
// change between reserve and settle never reprices a request in flight.

// moneyOf is the money of an estimate at the decision's time, and the price
// it was computed at (nil, 0 when the model has no price). A model without
// a price cannot be admitted where a money window must count it
// (rule.RequirePrice, at every level): the request is refused, not let
// through uncounted. The glue between the decision's price book and the
// rule: the prices are the estimator's.
func (d *decision) moneyOf(est estimator.Estimate) (int64, *estimator.Price, error) {
	var p estimator.Price
	ok := false
	if d.prices != nil {
		p, ok = d.prices.At(est.Model, d.now)
	}
	if !ok {
		for _, lv := range d.chain {
			if err := rule.RequirePrice(est.Model, lv.id, lv.Limits); err != nil {
				return 0, nil, err
			}
		}
		return 0, nil, nil
	}
	m, err := p.Cost(estimator.MoneyUsage{Input: est.InputTokens, Output: est.OutputTokens})
	if err != nil {
		return 0, nil, &rule.OverflowError{Field: "money", Op: err.Error()}
	}
	return m, &p, nil
}

// moneyActual is the money of a settle's usage (nil: a release, 0) for
// admission a, at the price a was reserved at. A refund-style usage (a
// gateway's negative hits) keeps the share of the estimate's money that it
// keeps of the estimate's cost (rule.MoneyKept).
func (d *decision) moneyActual(a *Admission, usage *SettleParams) (int64, error) {
	if usage == nil {
		return 0, nil
	}
	if usage.RefundTokens > 0 {
		if a.Estimate.Cost == 0 {
			return 0, nil
		}
		return rule.MoneyKept(*a.MoneyEstimate, a.Estimate.Cost, usage.RefundTokens), nil
	}
	var p estimator.Price
	ok := false
	if d.prices != nil && a.PriceFrom != nil {
		p, ok = d.prices.Exact(a.PriceModel, *a.PriceFrom)
	}
	if !ok {
		// Rows of model_prices are never changed nor deleted, and the load
		// step reloads the book when any was added: not finding the row an
		// admission names is a bug, and nothing is written.
		return 0, fmt.Errorf("budget: admission %s names the price of %s from %s, which the price book does not hold", a.ID, a.PriceModel, a.PriceFrom)
	}
	m, err := p.Cost(estimator.MoneyUsage{Input: usage.InputTokens, CachedRead: usage.CachedInputTokens,
		CacheWrite5m: usage.CacheWriteTokens, CacheWrite1h: usage.CacheWrite1hTokens, Output: usage.OutputTokens,
		Reasoning: usage.ReasoningTokens})
	if err != nil {
		return 0, &rule.OverflowError{Field: "money", Op: err.Error()}
	}
	return m, nil
}
