package estimator

import "strings"

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
