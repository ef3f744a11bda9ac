package estimator

import (
	"strings"
	"time"
)

// The service tiers a price row is keyed by (issue 38). Providers sell the
// same model at several speeds: flex (OpenAI's flex processing, Vertex's
// Flex PayGo) at about half the default price, priority at about double,
// and batch (the Batch APIs) at half. A row of model_prices prices one
// tier; a tier without a row of its own is priced at the default tier's
// row (PriceBook.AtTier), so a deployment that never stores a tier's price
// charges it as before.
const (
	TierDefault  = "default"
	TierFlex     = "flex"
	TierPriority = "priority"
	TierBatch    = "batch"
)

// ServiceTiers are the tiers a price may be stored for, TierDefault first.
var ServiceTiers = []string{TierDefault, TierFlex, TierPriority, TierBatch}

// TierReason is why a tier is refused, in the words every face answers
// with.
const TierReason = "must be one of default, flex, priority, batch"

// ValidTier says whether s is one of ServiceTiers.
func ValidTier(s string) bool { return tierIndex(s) >= 0 }

// CheckTier returns an *InvalidError naming field when s is neither empty
// (the default tier) nor one of ServiceTiers: the check a caller's claimed
// tier (a price row, a settle's usage) gets.
func CheckTier(s, field string) error {
	if s == "" || ValidTier(s) {
		return nil
	}
	return invalid(field, TierReason)
}

// tierIndex is s's place in ServiceTiers, -1 when it is none.
func tierIndex(s string) int {
	switch s {
	case TierDefault:
		return 0
	case TierFlex:
		return 1
	case TierPriority:
		return 2
	case TierBatch:
		return 3
	}
	return -1
}

// ReadServiceTier maps a provider's word for a service tier, in a request
// or in a response, onto a price tier; "" when the word names none (the
// caller then keeps the tier it knew: a request's "" is the default tier,
// a response's "" is the tier the admission was reserved at). The words of
// the three providers do not collide, so one reader serves every wire:
//
//   - OpenAI's service_tier: "default", "flex", "priority"; a request's
//     "auto" is "" (the project's default, which the response names).
//     "scale" (prepaid capacity units, not a per-token price) is "".
//   - Anthropic's request service_tier ("auto", "standard_only") is "";
//     its usage.service_tier is "standard", "priority" or "batch".
//   - Vertex AI's usageMetadata.trafficType: "ON_DEMAND" is the default
//     tier, "ON_DEMAND_PRIORITY" priority, "ON_DEMAND_FLEX" flex;
//     "PROVISIONED_THROUGHPUT" (paid for in advance) is "".
func ReadServiceTier(word string) string {
	switch strings.ToLower(strings.TrimSpace(word)) {
	case "default", "standard", "on_demand":
		return TierDefault
	case "flex", "on_demand_flex":
		return TierFlex
	case "priority", "on_demand_priority":
		return TierPriority
	case "batch":
		return TierBatch
	}
	return ""
}

// TierOr is tier, or TierDefault when it is "".
func TierOr(tier string) string {
	if tier == "" {
		return TierDefault
	}
	return tier
}

// BatchDiscountPercent is the share of a model's default price that the
// Batch APIs charge where no 'batch' row prices the model: both OpenAI's
// Batch API and Anthropic's Message Batches bill every token, cache reads
// and writes included, at 50% of the standard price (their pricing pages,
// checked 2026-12-04). It is defined here and nowhere else.
const BatchDiscountPercent = 50

// AtBatch is the price of a batch line of model at t: the 'batch' tier's
// row in effect, or else the default row at BatchDiscountPercent (every
// part of it, rounded up to a whole micro-unit: never below what the
// provider bills). It answers false when the model has no price at all.
//
// Why not AtTier's fallback (the default row at full price): that rule is
// right for flex and priority, whose price a deployment may not have
// stored, where the default price is the one the operator knows. A batch
// is never billed at the default price: every provider discounts it, so
// the full price would reserve and count twice what the invoice says, and
// a tenant's money budget would refuse batches it can afford.
func (b *PriceBook) AtBatch(model string, t time.Time) (Price, bool) {
	if b == nil {
		return Price{}, false
	}
	th, ok := resolveName(model, b.lookup)
	if !ok || th == nil {
		return Price{}, false
	}
	if p, ok := inEffect(th[tierIndex(TierBatch)], t); ok {
		return p, true
	}
	p, ok := inEffect(th[0], t)
	if !ok {
		return Price{}, false
	}
	return p.discounted(BatchDiscountPercent), true
}

// discounted is p with every price at percent of its own, rounded up, and
// ServiceTier TierBatch (the tier it prices, though no row of it exists).
func (p Price) discounted(percent int64) Price {
	of := func(v int64) int64 { return (v*percent + 99) / 100 }
	ptr := func(v *int64) *int64 {
		if v == nil {
			return nil
		}
		d := of(*v)
		return &d
	}
	p.ServiceTier = TierBatch
	p.InputMicro, p.OutputMicro = of(p.InputMicro), of(p.OutputMicro)
	p.CachedInputMicro, p.CacheWrite5mMicro, p.CacheWrite1hMicro = ptr(p.CachedInputMicro), ptr(p.CacheWrite5mMicro), ptr(p.CacheWrite1hMicro)
	p.ReasoningOutputMicro, p.LongInputMicro, p.LongOutputMicro = ptr(p.ReasoningOutputMicro), ptr(p.LongInputMicro), ptr(p.LongOutputMicro)
	return p
}
