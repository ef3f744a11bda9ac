package account

import (
	"context"

	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
	"github.com/tokengate/tokengate/ledger"
)

// SettleParams reports what a request actually used.
//
// The admission is named by AdmissionID or by IdempotencyKey, exactly one
// of them: the key is the one its reserve came with, live for 24 h
// (ReserveParams.IdempotencyKey), for faces whose callers name requests by
// their own ids. Either way the admission is found and locked in the
// decision's own round trip, and the Settlement carries it.
//
// The usage is InputTokens (of which CachedInputTokens came from the
// provider's prompt cache) and OutputTokens; or, instead, RefundTokens.
type SettleParams struct {
	TenantID    string
	AdmissionID string
	// IdempotencyKey names the admission by the tenant's live key instead
	// of AdmissionID. An unknown or expired key is ErrAdmissionNotFound.
	IdempotencyKey string
	InputTokens    int64
	OutputTokens   int64
	// CachedInputTokens is the part of InputTokens served from the
	// provider's prompt cache (0 <= cached <= InputTokens, else a
	// *UsageError): the decision prices them at the cached-input weight of
	// the admission's model in the store's model table
	// (estimator.Model.EffectiveInput), and the usage bounds apply to that
	// effective input, which is what the admission records as its actual
	// input. The faces need no read of the admission to price them.
	CachedInputTokens int64
	// CacheWriteTokens and CacheWrite1hTokens are the parts of InputTokens
	// the provider wrote to its prompt cache (Anthropic's
	// cache_creation_input_tokens: for 5 minutes, or every write when the
	// usage does not split them; and for an hour), priced at the model's
	// cache-write weights (estimator.Model.EffectiveCacheInput). With
	// CachedInputTokens they may not add up to more than InputTokens (a
	// *UsageError).
	CacheWriteTokens   int64
	CacheWrite1hTokens int64
	// ReasoningTokens is the part of OutputTokens the model spent
	// reasoning (OpenAI's completion_tokens_details.reasoning_tokens, the
	// Responses API's output_tokens_details.reasoning_tokens; 0 when the
	// usage does not say, as Anthropic's never does), so that money can
	// price them apart where a provider does (estimator.Price's
	// ReasoningOutputMicro). The token budget counts them as the output
	// they are part of. 0 <= ReasoningTokens <= OutputTokens, else a
	// *UsageError.
	ReasoningTokens int64
	// ServiceTier is the price tier the call was served at, as its
	// upstream reported it (estimator.ReadServiceTier; one of
	// estimator.ServiceTiers, else an *InvalidError naming service_tier),
	// "" when it did not say. Money charges that tier's price in effect
	// when the admission was reserved (the default tier's where that tier
	// has no row), or, with "", the price the admission was reserved at.
	// Tokens are counted the same at every tier.
	ServiceTier string
	// RefundTokens states the usage as a refund of the estimate instead (a
	// gateway's negative hits): the actual input is
	// max(0, estimate cost - RefundTokens) and the output 0. The estimate's
	// cost is in weighted tokens, so this suits admissions reserved at
	// weight one (a gateway's hits); it may not be negative nor come with
	// Input, Output or CachedInputTokens (an *InvalidError).
	RefundTokens int64
	Actor        string
	KeyID        string // as ReserveParams.KeyID; the tenant must not be disabled either
	GatewayID    string // as ReserveParams.GatewayID
	// Family is the model family of the request the settle ends, when its
	// face knows it: the admission layer resolves the request's failure
	// policy by it, for Defer. The store does not read it.
	Family string
	// Face is the face that ends the admission ("" is FaceAPI): one another
	// face made is refused (*OtherFaceError), and IdempotencyKey names an
	// admission in this face's namespace (ReserveParams.Face).
	Face rule.Face
	// Defer, for a settle by IdempotencyKey, is the request's failure
	// policy as far as the caller knows it: when the key names no
	// admission and the policy could be local, the settle is kept for the
	// admission a replica may have made on its own, and applied when that
	// admission is replayed (ErrDeferred). Nil keeps nothing.
	Defer *Deferral
}

// Validate returns an *InvalidError when p names its admission neither or
// both ways (rule.CheckAdmissionName), or states its usage both ways
// (rule.CheckRefund), and a *UsageError
// (ErrUsageOutOfBounds) when its usage is no usage a call could have used
// (rule.Usage.Check: a part of the input or output out of 0..the count it
// is part of, or a count past rule.MaxTokens). The decision applies it first; a replica deciding
// without the store (budget/outage) applies it too.
func (p SettleParams) Validate() error {
	if err := rule.CheckAdmissionName(p.AdmissionID, p.IdempotencyKey); err != nil {
		return err
	}
	claimed := p.Claimed()
	if err := rule.CheckRefund(p.RefundTokens, claimed); err != nil {
		return err
	}
	if p.ServiceTier != "" && !estimator.ValidTier(p.ServiceTier) {
		return &rule.InvalidError{Field: "service_tier", Reason: estimator.TierReason}
	}
	return claimed.Check()
}

// Claimed is the usage p states, as the caller counted it: the domain
// checks it as a claim (rule.Usage.Check), whatever face it came from.
func (p SettleParams) Claimed() rule.Usage {
	return rule.Usage{Input: p.InputTokens, Output: p.OutputTokens, Reasoning: p.ReasoningTokens,
		CacheRead: p.CachedInputTokens, CacheWrite5m: p.CacheWriteTokens, CacheWrite1h: p.CacheWrite1hTokens, Tier: p.ServiceTier}
}

// Usage is the input and output tokens a settle p charges an admission
// reserved as e (the usage bounds apply to its Tokens, before weights): with
// RefundTokens, the estimate's cost less the refund (never below 0) as
// input and no output; otherwise the input with its cached parts priced at
// the cache weights of e's model in t (nil: the seeded table), and
// the output. p must be valid (Validate).
func (p SettleParams) Usage(e estimator.Estimate, t *estimator.Table) (in, out int64) {
	if p.RefundTokens > 0 {
		return rule.RefundUsage(e.Cost, p.RefundTokens), 0
	}
	in, out = p.InputTokens, p.OutputTokens
	if p.CachedInputTokens > 0 || p.CacheWriteTokens > 0 || p.CacheWrite1hTokens > 0 {
		if t == nil {
			t = estimator.DefaultTable()
		}
		m, _ := t.Lookup(e.Model)
		in = m.EffectiveCacheInput(in, estimator.CacheUsage{Read: p.CachedInputTokens, Write5m: p.CacheWriteTokens, Write1h: p.CacheWrite1hTokens})
	}
	return in, out
}

// Tokens is the input and output tokens p reports as they were counted,
// before any cache weight: what the usage bounds (SettleBounds) judge, since
// a context window holds tokens, not their price. A 150 000-token write to
// the one-hour cache fits a 200 000-token window, though Usage charges it
// as 300 000 input tokens. A refund's is what Usage charges.
func (p SettleParams) Tokens(e estimator.Estimate) (in, out int64) {
	if p.RefundTokens > 0 {
		return p.Usage(e, nil)
	}
	return p.InputTokens, p.OutputTokens
}

// Settlement is the reconciliation of one admission.
type Settlement struct {
	Admission *Admission
	// DeltaMicro is the effective change of the balance: positive for a
	// refund (after the capacity cap), negative for an extra charge.
	DeltaMicro   int64
	BalanceMicro int64
	Snapshot     rule.Snapshot
	// Replayed is true when the admission had already ended this way and
	// the original answer is returned.
	Replayed bool
}

// Settle reconciles an admission with its actual usage: it refunds
// estimate - actual (capped at capacity) or charges the excess, frees the
// concurrency slot and appends a settle entry. Settling again with the same
// usage returns the original answer. A settle of an expired admission still
// reconciles (late). It returns ErrAdmissionNotFound (also for another
// tenant's admission, or a key that names none), ErrDeferred (which wraps
// it) when a key named none and the settle was kept (p.Defer), ErrConflict when the
// admission was released or settled with different usage, what
// p.Validate returns, a *UsageError (ErrUsageOutOfBounds), an
// *OtherFaceError (ErrOtherFace) when another face than p.Face made the
// admission, ErrKeyRevoked, ErrGatewayRevoked or ErrOutOfScope.
func (s *Store) Settle(ctx context.Context, p SettleParams) (*Settlement, error) {
	r, err := s.decideOne(ctx, p.TenantID, Op{Settle: &p})
	return r.Settlement, err
}

// ReleaseParams names an admission whose request never ran, by
// AdmissionID or by IdempotencyKey, exactly one of them (as SettleParams).
type ReleaseParams struct {
	TenantID       string
	AdmissionID    string
	IdempotencyKey string // as SettleParams.IdempotencyKey
	Actor          string
	KeyID          string    // as SettleParams.KeyID
	GatewayID      string    // as ReserveParams.GatewayID
	Family         string    // as SettleParams.Family
	Defer          *Deferral // as SettleParams.Defer
	Face           rule.Face // as SettleParams.Face
}

// Validate returns an *InvalidError when p names its admission neither or
// both ways.
func (p ReleaseParams) Validate() error {
	return rule.CheckAdmissionName(p.AdmissionID, p.IdempotencyKey)
}

// Release refunds an admission's whole estimate (capped at capacity): the
// request never ran. Releasing again returns the original answer. It
// returns ErrAdmissionNotFound, ErrDeferred (as Settle), ErrConflict when the admission was
// already settled, what p.Validate returns, an *OtherFaceError (as
// Settle), ErrKeyRevoked, ErrGatewayRevoked or ErrOutOfScope.
func (s *Store) Release(ctx context.Context, p ReleaseParams) (*Settlement, error) {
	r, err := s.decideOne(ctx, p.TenantID, Op{Release: &p})
	return r.Settlement, err
}

func deref(p *int64) int64 {
	if p == nil {
		return 0
	}
	return *p
}

// expire expires the tenant's overdue reservations that the batch locked:
// each stays charged at its estimate (delta 0), frees its concurrency slot
// and gets an expire entry. One this batch already settled or released is
// left alone; one it expires, a later settle in the batch finds expired (and
// reconciles late).
func (d *decision) expire(overdue []*Admission) int {
	t, now := d.t, d.now
	n := 0
	for _, locked := range overdue {
		a := locked
		if ended, ok := d.adms[a.ID]; ok {
			a = ended
		}
		if a.ExpiresAt.After(now) || a.State != StateReserved {
			continue // locked by the query but not yet due at the locked clock, or ended meanwhile
		}
		for _, lv := range d.chain {
			skip := rule.SkipOf(a.Shadowed, lv.id)
			lv.ExpireExcept(skip)
			e := lv.entry(ledger.KindExpire, now, "sweeper")
			e.AdmissionID, e.Model = a.ID, a.Estimate.Model
			e.Estimate = &a.Estimate.Cost
			e.Reason = shadowReason(skip)
			lv.seal(e)
			d.w.entry(lv, e)
		}
		expired := *a
		expired.State, expired.EndedAt = StateExpired, &now
		zero, balance := int64(0), t.Tokens.BalanceMicro
		expired.EndDeltaMicro, expired.EndBalanceMicro = &zero, &balance
		d.adms[a.ID] = &expired
		d.w.end(&expired)
		n++
	}
	return n
}
