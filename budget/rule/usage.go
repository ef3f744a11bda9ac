// This file holds Usage, what one call used, and the two policies every
// face applies to it: a usage a caller claims is checked (a field-naming
// error, nothing charged), a usage an upstream reported is clamped (the
// call ran: it is charged, but never beyond the bound). The bound on a
// token count is defined here once.

package rule

import (
	"fmt"
	"math"
)

// MaxTokens is the most tokens any one count of a usage may state (input,
// output, or any part of them): a thousand times the widest context window
// any provider serves, and small enough that a count times the heaviest
// weight (1e9 micro) stays far from the edges of int64. The model's own
// window bounds a settle more tightly (UsageBounds); this bound
// holds before the model is known.
const MaxTokens int64 = 1_000_000_000

// Usage is what one call used, as counted, before any weight: Input is
// every input token, of which CacheRead were read from the provider's
// prompt cache and CacheWrite5m and CacheWrite1h written to it (for 5
// minutes, or for a lifetime the provider did not state; and for an
// hour); Output is every output token, of which Reasoning were spent
// reasoning. Every wire's usage is said in these terms: Anthropic's
// input_tokens, which leaves the cache out, is added up with it.
type Usage struct {
	Input        int64
	Output       int64
	Reasoning    int64
	CacheRead    int64
	CacheWrite5m int64
	CacheWrite1h int64
	// Tier is the price tier the call was served at, as its upstream
	// reported it (estimator.ReadServiceTier: "default", "flex",
	// "priority", "batch"), "" when it did not say: the settle then
	// charges the tier the admission was reserved at. Check and Clamp
	// leave it as it is; the domain's settle judges it
	// (account.SettleParams.Validate).
	Tier string
}

// The fields of a Usage as a *UsageError names them: OpenAI's names, and
// Anthropic's for the cache's writes, which OpenAI's usage does not
// report. A face whose caller named them otherwise says them in its own
// words.
const (
	FieldInput      = "prompt_tokens"
	FieldOutput     = "completion_tokens"
	FieldCacheRead  = "prompt_tokens_details.cached_tokens"
	FieldCacheWrite = "cache_creation_input_tokens"
	FieldReasoning  = "completion_tokens_details.reasoning_tokens"
)

// InBounds says whether n is a token count any usage may state: 0 to
// MaxTokens. Faces that add a usage up from several counts of their wire
// judge each with it first.
func InBounds(n int64) bool { return n >= 0 && n <= MaxTokens }

// BoundsReason is why a count is not InBounds, in the words every face
// answers with.
var BoundsReason = fmt.Sprintf("must be between 0 and %d", MaxTokens)

// Check returns a *UsageError (ErrUsageOutOfBounds) when u is not a usage any call
// could have used: a part of the input (the cache's reads and writes) or
// of the output (reasoning) negative or more than what is left of the
// count it is part of, or the input or output outside 0..MaxTokens. The
// parts are judged first, against the totals as stated (a negative total
// as 0), so that the error names the part a caller got wrong. It is the
// check for a usage a caller claims (the HTTP API's settle, the domain's
// settle, the rate limit service); a usage an upstream reported is
// clamped instead (Clamp).
func (u Usage) Check() error {
	in, out := max(u.Input, 0), max(u.Output, 0)
	switch {
	case u.CacheRead < 0 || u.CacheRead > in:
		return &UsageError{Field: FieldCacheRead, Bound: in,
			Reason: fmt.Sprintf("%d must be between 0 and the %d input tokens it is part of", u.CacheRead, u.Input)}
	case u.CacheWrite1h < 0 || u.CacheWrite1h > in-u.CacheRead:
		return &UsageError{Field: FieldCacheWrite, Bound: in - u.CacheRead,
			Reason: fmt.Sprintf("%d written to the cache for an hour must not be negative nor add up, with %d cache reads, to more than the %d input tokens it is part of",
				u.CacheWrite1h, u.CacheRead, u.Input)}
	case u.CacheWrite5m < 0 || u.CacheWrite5m > in-u.CacheRead-u.CacheWrite1h:
		return &UsageError{Field: FieldCacheWrite, Bound: in - u.CacheRead - u.CacheWrite1h,
			Reason: fmt.Sprintf("%d and %d written to the cache must not be negative nor add up, with %d cache reads, to more than the %d input tokens they are part of",
				u.CacheWrite5m, u.CacheWrite1h, u.CacheRead, u.Input)}
	case u.Reasoning < 0 || u.Reasoning > out:
		return &UsageError{Field: FieldReasoning, Bound: out,
			Reason: fmt.Sprintf("%d must be between 0 and the %d output tokens it is part of", u.Reasoning, u.Output)}
	case !InBounds(u.Input):
		return &UsageError{Field: FieldInput, Bound: MaxTokens, Reason: BoundsReason}
	case !InBounds(u.Output):
		return &UsageError{Field: FieldOutput, Bound: MaxTokens, Reason: BoundsReason}
	}
	return nil
}

// ClampTokens is a reported count within the bounds: 0 if negative,
// MaxTokens if past it. Clamp applies it to a usage's totals; a face that
// adds a usage up from several reported counts applies it to each first,
// so that no sum can leave int64.
func ClampTokens(n int64) int64 { return min(max(n, 0), MaxTokens) }

// Clamp brings a usage an upstream reported within the bounds Check
// judges, and says whether anything changed. The call already ran, so a
// reported usage is a fact to charge, not a claim to refuse; but an
// upstream's error must not charge without bound. A negative count is 0;
// the input and output are at most MaxTokens; the cache's reads, then its
// 5 minute writes, then its 1 hour writes take at most what is left of the
// input; reasoning is at most the output. A face that knows tighter
// totals (the model's window: UsageBound.Clamp) sets them and clamps
// again, so that the parts follow.
func (u Usage) Clamp() (Usage, bool) {
	c := u
	c.Input, c.Output = ClampTokens(u.Input), ClampTokens(u.Output)
	left := c.Input
	take := func(n int64) int64 {
		n = min(max(n, 0), left)
		left -= n
		return n
	}
	c.CacheRead = take(u.CacheRead)
	c.CacheWrite5m = take(u.CacheWrite5m)
	c.CacheWrite1h = take(u.CacheWrite1h)
	c.Reasoning = min(max(u.Reasoning, 0), c.Output)
	return c, c != u
}

// UsageBound is the most usage a settle of one admission may report, in
// raw tokens before any cache weight: MaxOutput output tokens, and
// MaxTotal input plus output. It is the bound of a model's context
// window, which the caller reads from its model table (UsageBounds);
// rule knows no models.
type UsageBound struct {
	MaxOutput int64
	MaxTotal  int64
}

// UsageBounds is the bound of a settle of an admission that reserved
// reservedIn input and reservedOut output tokens of a model whose widest
// context window is window (MaxUnknownModelUsage for a model the table
// does not know): output up to the output it reserved, and input plus
// output up to the window, or the reservation if larger (a batch of
// prompts or n > 1 reserves for several sequences). Negative reserved
// counts are 0, and a sum past int64 saturates.
func UsageBounds(window, reservedIn, reservedOut int64) UsageBound {
	reserved, ok := Add64(max(reservedIn, 0), max(reservedOut, 0))
	if !ok {
		reserved = math.MaxInt64
	}
	return UsageBound{MaxOutput: max(reservedOut, 0), MaxTotal: max(window, reserved)}
}

// Check returns a *UsageError (ErrUsageOutOfBounds) when in and out are
// not usage within b, or are negative; nil otherwise. It is the check of
// a usage a caller claims: nothing is charged.
func (b UsageBound) Check(in, out int64) error {
	switch {
	case in < 0:
		return &UsageError{Field: FieldInput, Reason: "must not be negative", Bound: b.MaxTotal}
	case out < 0:
		return &UsageError{Field: FieldOutput, Reason: "must not be negative", Bound: b.MaxOutput}
	case out > b.MaxOutput:
		return &UsageError{Field: FieldOutput, Bound: b.MaxOutput,
			Reason: fmt.Sprintf("%d exceeds the %d output tokens the admission reserved", out, b.MaxOutput)}
	case in > b.MaxTotal-out:
		return &UsageError{Field: FieldInput, Bound: b.MaxTotal - out,
			Reason: fmt.Sprintf("%d input plus %d output tokens exceed the model's context window of %d tokens", in, out, b.MaxTotal)}
	}
	return nil
}

// Clamp brings in and out within b (output first, then input), for usage
// that is a fact rather than a claim: the proxy's upstream already ran the
// request. clamped says whether anything changed.
func (b UsageBound) Clamp(in, out int64) (cin, cout int64, clamped bool) {
	cin, cout = min(max(in, 0), b.MaxTotal), min(max(out, 0), b.MaxOutput)
	cin = min(cin, b.MaxTotal-cout)
	return cin, cout, cin != in || cout != out
}

// CheckAdmissionName is the rule of a settle's or release's admission:
// named by id or by idempotency key, exactly one of them. It returns an
// *InvalidError on admission_id.
func CheckAdmissionName(admissionID, key string) error {
	switch {
	case admissionID == "" && key == "":
		return &InvalidError{Field: "admission_id", Reason: "name the admission by its id or by its idempotency key"}
	case admissionID != "" && key != "":
		return &InvalidError{Field: "admission_id", Reason: "name the admission by its id or by its idempotency key, not both"}
	}
	return nil
}

// CheckRefund is the rule of a settle stated as a refund of refundTokens
// (a gateway's negative hits): never negative, and a refund states the
// usage by itself, so claimed input, output and cache counts must be 0.
// It returns an *InvalidError on refund_tokens.
func CheckRefund(refundTokens int64, claimed Usage) error {
	switch {
	case refundTokens < 0:
		return &InvalidError{Field: "refund_tokens", Reason: "must not be negative"}
	case refundTokens > 0 && (claimed.Input != 0 || claimed.Output != 0 || claimed.CacheRead != 0 || claimed.CacheWrite5m != 0 || claimed.CacheWrite1h != 0):
		return &InvalidError{Field: "refund_tokens", Reason: "a refund states the usage by itself: input, output and cached tokens must be 0"}
	}
	return nil
}

// RefundUsage is the input a refund of refundTokens of an estimate that
// cost cost charges: the cost less the refund, never below 0 (and no
// output).
func RefundUsage(cost, refundTokens int64) int64 {
	in, _ := Sub64(cost, refundTokens)
	return max(0, in)
}
