package rule

import (
	"fmt"
	"math/big"
)

// Money (issue 25): an admission of a model with a price is charged in
// money too, at the price in effect when it was reserved; the price book
// (estimator.PriceBook) prices it, and these are the rules around it.

// RequirePrice returns an *InvalidError (field model) naming the
// window when tenantID's limits l count money in a window they enforce:
// a model without a price cannot be admitted there, or the request would
// go through uncounted; nil otherwise. A shadow period budget only
// counts, so it requires no price.
func RequirePrice(model, tenantID string, l Limits) error {
	if l.Shadow.Has(LimitPeriodBudget) {
		return nil
	}
	for _, w := range l.Windows {
		if w.Counts == CountMoney {
			return &InvalidError{Field: "model", Reason: fmt.Sprintf(
				"%q has no price in effect, and window %s of %s counts money: add its price (tokengate prices add) to admit it", model, w.Name, tenantID)}
		}
	}
	return nil
}

// MoneyKept is the money of a usage that refunds refundTokens of an
// estimate that cost cost and was priced moneyEstimate (a gateway's
// negative hits): the share of the money that the usage keeps of the cost,
// rounded toward zero, and 0 for an estimate that cost nothing. The
// product is exact whatever its size.
func MoneyKept(moneyEstimate, cost, refundTokens int64) int64 {
	if cost == 0 {
		return 0
	}
	kept := max(0, cost-refundTokens)
	n := new(big.Int).Mul(big.NewInt(moneyEstimate), big.NewInt(kept))
	return n.Quo(n, big.NewInt(cost)).Int64()
}
