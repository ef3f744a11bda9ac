package estimator

// Anthropic's published prompt-cache prices, relative to an input token:
// a cache read costs 0.1, a 5 minute write 1.25, a 1 hour write 2.
const (
	claudeCacheReadWeightMicro = WeightOne / 10
	claudeCacheWriteWeight     = WeightOne * 5 / 4
	claudeCacheWrite1hWeight   = WeightOne * 2
)

// claudePartTokens is the default of one image or document part whose size
// tokengate cannot read (a URL or a file id): the most an image costs under
// Anthropic's rule (about w*h/750, scaled down to 1568 px on its long edge
// and about 1.15 megapixels, so at most about 1600 tokens).
const claudePartTokens = 1600

// claudeFamilies are Anthropic's current models, from its model overview
// pages (December 2026). A dated variant ("claude-haiku-4-5-20251001")
// and an alias ("claude-sonnet-4-0") find their family by the table's
// prefix rule. The default output cap is each model's largest max_tokens
// (a Messages request names its own anyway). Sonnet 4.5 and 4 are seeded
// at their standard 200k window (their 1M window is a beta an operator can
// set per model). The Mythos models' figures are assumed to be the
// lineup's (1M, 128K): their pages are behind Anthropic's access program.
var claudeFamilies = []Model{
	{Name: "claude-fable-5-2", DefaultOutputTokens: 128000, ContextWindow: 1000000},
	{Name: "claude-fable-5-1", DefaultOutputTokens: 128000, ContextWindow: 1000000},
	{Name: "claude-fable-5", DefaultOutputTokens: 128000, ContextWindow: 1000000},
	{Name: "claude-mythos-5-2", DefaultOutputTokens: 128000, ContextWindow: 1000000},
	{Name: "claude-mythos-5-1", DefaultOutputTokens: 128000, ContextWindow: 1000000},
	{Name: "claude-mythos-5", DefaultOutputTokens: 128000, ContextWindow: 1000000},
	{Name: "claude-opus-5-5", DefaultOutputTokens: 128000, ContextWindow: 1000000},
	{Name: "claude-sonnet-5-5", DefaultOutputTokens: 128000, ContextWindow: 1000000},
	{Name: "claude-haiku-5-5", DefaultOutputTokens: 128000, ContextWindow: 1000000},
	{Name: "claude-opus-5", DefaultOutputTokens: 128000, ContextWindow: 1000000},
	{Name: "claude-sonnet-5", DefaultOutputTokens: 128000, ContextWindow: 1000000},
	{Name: "claude-opus-4-8", DefaultOutputTokens: 128000, ContextWindow: 1000000},
	{Name: "claude-opus-4-7", DefaultOutputTokens: 128000, ContextWindow: 1000000},
	{Name: "claude-opus-4-6", DefaultOutputTokens: 128000, ContextWindow: 1000000},
	{Name: "claude-sonnet-4-6", DefaultOutputTokens: 128000, ContextWindow: 1000000},
	{Name: "claude-opus-4-5", DefaultOutputTokens: 64000, ContextWindow: 200000},
	{Name: "claude-sonnet-4-5", DefaultOutputTokens: 64000, ContextWindow: 200000},
	{Name: "claude-haiku-4-5", DefaultOutputTokens: 64000, ContextWindow: 200000},
	{Name: "claude-opus-4-1", DefaultOutputTokens: 32000, ContextWindow: 200000},
	{Name: "claude-opus-4", DefaultOutputTokens: 32000, ContextWindow: 200000},
	{Name: "claude-sonnet-4", DefaultOutputTokens: 64000, ContextWindow: 200000},
}

// olderTokenizer are the families before Claude 4.7, whose tokenizer
// counts about 30 % fewer tokens for the same text than the one Claude 4.7
// and later use (Anthropic's Haiku 5.5 overview).
var olderTokenizer = map[string]bool{
	"claude-opus-4-6": true, "claude-sonnet-4-6": true, "claude-opus-4-5": true, "claude-sonnet-4-5": true,
	"claude-haiku-4-5": true, "claude-opus-4-1": true, "claude-opus-4": true, "claude-sonnet-4": true,
}

// MessagesSafetyFactorMilli scales the o200k_base count of a Messages
// request's text, in thousandths, for the model family: there is no public
// Claude tokenizer. Claude's count of English prose and code runs above
// o200k's (public comparisons put the tokenizer before Claude 4.7 10 to
// 30 % higher; it was not measured on a corpus here): 1.25 for those
// families, and 1.25 x 1.3 = 1.625 for Claude 4.7 and later and for any
// other family (an unknown name, an operator's own), whose tokenizer
// Anthropic says counts about 30 % more. It leans toward reserving more
// than the call uses, which the settle refunds; the drift report per
// model shows operators the estimate's bias, and every Messages estimate
// is approximate.
func MessagesSafetyFactorMilli(family string) int64 {
	if olderTokenizer[family] {
		return 1250
	}
	return 1625
}

// claudeModels returns claudeFamilies with the encoding, the part default
// and Anthropic's weights: input and output 1.0 (the budget is counted in
// tokens, as for every seeded family), cache reads 0.1, cache writes 1.25
// (5 minutes) and 2.0 (1 hour).
func claudeModels() []Model {
	ms := make([]Model, len(claudeFamilies))
	for i, m := range claudeFamilies {
		m.Encoding = EncodingO200K
		m.PartTokens = claudePartTokens
		m.InputWeightMicro, m.OutputWeightMicro = WeightOne, WeightOne
		m.CachedInputWeightMicro = claudeCacheReadWeightMicro
		m.CacheWriteWeightMicro = claudeCacheWriteWeight
		m.CacheWrite1hWeightMicro = claudeCacheWrite1hWeight
		ms[i] = m
	}
	return ms
}

// ScaleMessagesCount is an o200k_base count of n tokens of Messages text
// for the family, times its safety factor, rounded up.
func ScaleMessagesCount(family string, n int64) int64 {
	return (max(n, 0)*MessagesSafetyFactorMilli(family) + 999) / 1000
}
