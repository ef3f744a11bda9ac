package account

import (
	"fmt"
	"time"

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
//
// Service tiers (issue 38): an admission is reserved at the price of the
// tier its request asked for (estimator.Estimate.ServiceTier; the default
// tier's row when that tier has none, PriceBook.AtTier) and at the
// long-context bracket its estimated input falls in (Price.Cost prices the
// whole call at the long rates above the threshold). Its settle charges
// the tier the upstream reported (SettleParams.ServiceTier), at that
// tier's row in effect when it was reserved; with no tier reported, the
// row it was reserved at. A ledger entry priced at any tier but the
// default names it in its detail (tierDetail).

// moneyOf is the money of an estimate at the decision's time, and the price
// it was computed at (nil, 0 when the model has no price). A model without
// a price cannot be admitted where a money window must count it
// (rule.RequirePrice, at every level): the request is refused, not let
// through uncounted. The glue between the decision's price book and the
// rule: the prices are the estimator's.
func (d *decision) moneyOf(est estimator.Estimate) (int64, *estimator.Price, error) {
	m, p, err := priceOf(d.prices, est, d.now)
	if err != nil || p != nil {
		return m, p, err
	}
	for _, lv := range d.chain {
		if err := rule.RequirePrice(est.Model, lv.id, lv.Limits); err != nil {
			return 0, nil, err
		}
	}
	return 0, nil, nil
}

// priceOf is the money of an estimate at the row of book in effect at at
// (its service tier's, else the default tier's), and that row; nil, 0 when
// book (nil: none) does not price its model. The one pricing of a
// reservation: a decision's (moneyOf), an outage replay's, a lease
// admission's (PriceAdmission).
func priceOf(book *estimator.PriceBook, est estimator.Estimate, at time.Time) (int64, *estimator.Price, error) {
	if book == nil {
		return 0, nil, nil
	}
	p, ok := book.AtTier(est.Model, est.ServiceTier, at)
	if !ok {
		return 0, nil, nil
	}
	m, err := p.Cost(estimator.MoneyUsage{Input: est.InputTokens, Output: est.OutputTokens})
	if err != nil {
		return 0, nil, &rule.OverflowError{Field: "money", Op: err.Error()}
	}
	return m, &p, nil
}

// priced records on a the price it is reserved at and the money of its
// estimate (price nil: unpriced, counted in tokens only).
func (a *Admission) priced(price *estimator.Price, money int64) {
	if price != nil {
		a.PriceModel, a.PriceFrom, a.PriceTier, a.MoneyEstimate = price.Model, &price.EffectiveFrom, estimator.TierOr(price.ServiceTier), &money
	}
}

// PriceAdmission prices an admission made outside a decision (a lease
// admission, budget/admission) as a reserve of its Estimate at at is
// priced: PriceModel, PriceFrom, PriceTier and MoneyEstimate from book's
// row in effect then; a model book does not price stays unpriced (a
// tenant whose limits count money is never leased). It returns an
// *rule.OverflowError when the money does not fit, as a reserve refuses.
func PriceAdmission(book *estimator.PriceBook, a *Admission, at time.Time) error {
	money, price, err := priceOf(book, a.Estimate, at)
	if err != nil {
		return err
	}
	a.priced(price, money)
	return nil
}

// moneyActual is the money of a settle's usage (nil: a release, 0) for
// admission a, and the tier of the row it was priced at: the row of the
// tier the usage reports in effect when a was reserved (the default
// tier's when that tier had none), or the row a was reserved at when the
// usage reports no tier, or that tier's row does not price a's model. A
// refund-style usage (a gateway's negative hits) keeps the share of the
// estimate's money that it keeps of the estimate's cost (rule.MoneyKept), at
// a's tier.
func (d *decision) moneyActual(a *Admission, usage *SettleParams) (int64, string, error) {
	reserved := estimator.TierOr(a.PriceTier)
	if usage == nil {
		return 0, reserved, nil
	}
	if usage.RefundTokens > 0 {
		if a.Estimate.Cost == 0 {
			return 0, reserved, nil
		}
		return rule.MoneyKept(*a.MoneyEstimate, a.Estimate.Cost, usage.RefundTokens), reserved, nil
	}
	var p estimator.Price
	ok := false
	if tier := usage.ServiceTier; d.prices != nil && tier != "" && tier != reserved {
		p, ok = d.prices.AtTier(a.PriceModel, tier, a.CreatedAt)
	}
	if !ok && d.prices != nil && a.PriceFrom != nil {
		p, ok = d.prices.ExactTier(a.PriceModel, reserved, *a.PriceFrom)
	}
	if !ok {
		// Rows of model_prices are never changed nor deleted, and the load
		// step reloads the book when any was added: not finding the row an
		// admission names is a bug, and nothing is written.
		return 0, "", fmt.Errorf("budget: admission %s names the %s price of %s from %s, which the price book does not hold", a.ID, reserved, a.PriceModel, a.PriceFrom)
	}
	m, err := p.Cost(estimator.MoneyUsage{Input: usage.InputTokens, CachedRead: usage.CachedInputTokens,
		CacheWrite5m: usage.CacheWriteTokens, CacheWrite1h: usage.CacheWrite1hTokens, Output: usage.OutputTokens,
		Reasoning: usage.ReasoningTokens})
	if err != nil {
		return 0, "", &rule.OverflowError{Field: "money", Op: err.Error()}
	}
	return m, estimator.TierOr(p.ServiceTier), nil
}

// tierDetail is the ledger detail naming the service tier a call was
// served at (asked for, at a reserve; reported, else as reserved, at a
// settle) and the tier of the price row it was charged at, or "" when
// both are the default tier: entries of deployments that price no tier
// read as they did before tiers.
func tierDetail(served, priced string) string {
	served, priced = estimator.TierOr(served), estimator.TierOr(priced)
	if served == estimator.TierDefault && priced == estimator.TierDefault {
		return ""
	}
	return fmt.Sprintf(`"service_tier":%q,"price_tier":%q`, served, priced)
}
