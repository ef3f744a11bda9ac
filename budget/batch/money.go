package batch

import (
	"context"
	"fmt"
	"time"

	"github.com/tokengate/tokengate/estimator"
)

// Money (issue 38): a batch line is priced in money at the batch price of
// its model (estimator.PriceBook.AtBatch: the 'batch' tier's row, else the
// default row at estimator.BatchDiscountPercent), its estimate when it is
// planned and its reported usage, cached parts at their own prices, when
// it settles, at the row in effect when the batch was created. The money
// is carried by the batch's ledger entries and counted in the tenant's
// money windows (account.LockedMoney); the allowance stays in tokens.

// linePrices prices lines at one instant.
type linePrices struct {
	book *estimator.PriceBook
	at   time.Time
}

// prices is the price book as committed now, at the store's clock.
func (s *Service) prices(ctx context.Context) (linePrices, error) {
	book, err := s.store.PriceBook(ctx)
	if err != nil {
		return linePrices{}, err
	}
	now, err := s.now(ctx)
	if err != nil {
		return linePrices{}, err
	}
	return linePrices{book: book, at: now}, nil
}

// estimate is the money of a line's estimate, nil when its model has no
// price.
func (p linePrices) estimate(est estimator.Estimate) (*int64, error) {
	return p.cost(est.Model, estimator.MoneyUsage{Input: est.InputTokens, Output: est.OutputTokens})
}

// cost is the money of usage u of model at the batch price, nil when the
// model has no price.
func (p linePrices) cost(model string, u estimator.MoneyUsage) (*int64, error) {
	pr, ok := p.book.AtBatch(model, p.at)
	if !ok {
		return nil, nil
	}
	m, err := pr.Cost(u)
	if err != nil {
		return nil, fmt.Errorf("batch: price of %s: %w", model, err)
	}
	return &m, nil
}

// cacheParts clamps a line's reported cache parts to its input, reads
// first, as a single request's are (estimator.Model.EffectiveCacheInput):
// the cache never counts more tokens than the call used.
func cacheParts(in int64, c estimator.CacheUsage) estimator.CacheUsage {
	left := max(in, 0)
	take := func(n int64) int64 {
		n = min(max(n, 0), left)
		left -= n
		return n
	}
	return estimator.CacheUsage{Read: take(c.Read), Write5m: take(c.Write5m), Write1h: take(c.Write1h)}
}
