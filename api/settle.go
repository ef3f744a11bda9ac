package api

import (
	"errors"

	"github.com/labstack/echo/v5"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/admission"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

// settleAdmission is POST /v1/admissions/{id}/settle: the caller's usage,
// read from any wire's names and checked as a claim (rule.Usage.Check),
// settles the admission.
func (s *Server) settleAdmission(c *echo.Context) error {
	body, err := readBody(c)
	if err != nil {
		return err
	}
	u, err := parseUsage(body)
	if err != nil {
		return err
	}
	// Cached input tokens are priced by the domain, at the admission's
	// model's cached weight, in the settle's own transaction.
	st, journaled, err := s.admitter.Settle(c.Request().Context(), admission.FaceAPI, account.SettleParams{
		TenantID: tenantOf(c), AdmissionID: c.Param("id"), InputTokens: u.Input, OutputTokens: u.Output, CachedInputTokens: u.CacheRead,
		CacheWriteTokens: u.CacheWrite5m, CacheWrite1hTokens: u.CacheWrite1h, ReasoningTokens: u.Reasoning, ServiceTier: u.Tier,
		Actor: "key:" + keyOf(c), KeyID: keyOf(c),
	})
	return s.ended(c, "settle", st, journaled, err)
}

// settleBody accepts OpenAI's usage names and the generic ones, the
// cached input and reasoning output tokens of either OpenAI API's
// details, and Anthropic's usage as its Messages API reports it.
type settleBody struct {
	Usage *struct {
		PromptTokens        *int64         `json:"prompt_tokens"`
		CompletionTokens    *int64         `json:"completion_tokens"`
		InputTokens         *int64         `json:"input_tokens"`
		OutputTokens        *int64         `json:"output_tokens"`
		PromptTokensDetails *cachedDetails `json:"prompt_tokens_details"`
		InputTokensDetails  *cachedDetails `json:"input_tokens_details"`
		// The part of the output spent reasoning, by Chat Completions'
		// name and by the Responses API's.
		CompletionTokensDetails *reasoningDetails `json:"completion_tokens_details"`
		OutputTokensDetails     *reasoningDetails `json:"output_tokens_details"`
		// Anthropic's: its input_tokens leaves out the tokens read from
		// and written to the prompt cache, which it counts apart.
		CacheReadInputTokens     *int64         `json:"cache_read_input_tokens"`
		CacheCreationInputTokens *int64         `json:"cache_creation_input_tokens"`
		CacheCreation            *cacheCreation `json:"cache_creation"`
		// The service tier the call was served at, as the provider's
		// response named it (OpenAI's service_tier, Anthropic's
		// usage.service_tier, Vertex's trafficType): money is charged at
		// that tier's price. Absent: the tier reserved at.
		ServiceTier *string `json:"service_tier"`
	} `json:"usage"`
}

// cacheCreation is Anthropic's split of its cache writes by lifetime.
type cacheCreation struct {
	Ephemeral5m *int64 `json:"ephemeral_5m_input_tokens"`
	Ephemeral1h *int64 `json:"ephemeral_1h_input_tokens"`
}

type cachedDetails struct {
	CachedTokens *int64 `json:"cached_tokens"`
}

type reasoningDetails struct {
	ReasoningTokens *int64 `json:"reasoning_tokens"`
}

// usageNames are the names a settle body gave a usage's fields, which its
// 400 names back.
type usageNames map[string]string

// parseUsage reads a settle's usage and checks it as a claim: the body's
// form here (a field required, two names of one figure that disagree, a
// count a face adds up out of bounds), the usage's bounds by
// rule.Usage.Check, named as the body named the field.
func parseUsage(body []byte) (rule.Usage, error) {
	var u rule.Usage
	var sb settleBody
	if err := decodeJSON(body, &sb); err != nil {
		return u, err
	}
	if sb.Usage == nil {
		return u, invalid("usage", "required: {\"usage\":{\"prompt_tokens\":N,\"completion_tokens\":N}}")
	}
	w := sb.Usage
	names := usageNames{}
	var err error
	if u.Input, names[rule.FieldInput], err = pick(w.PromptTokens, w.InputTokens, "usage.prompt_tokens", "usage.input_tokens"); err != nil {
		return u, err
	}
	if u.Output, names[rule.FieldOutput], err = pick(w.CompletionTokens, w.OutputTokens, "usage.completion_tokens", "usage.output_tokens"); err != nil {
		return u, err
	}
	if u.CacheRead, names[rule.FieldCacheRead], err = pickDetail(cachedOf(w.PromptTokensDetails), cachedOf(w.InputTokensDetails),
		"usage.prompt_tokens_details.cached_tokens", "usage.input_tokens_details.cached_tokens"); err != nil {
		return u, err
	}
	if u.Reasoning, names[rule.FieldReasoning], err = pickDetail(reasoningOf(w.CompletionTokensDetails), reasoningOf(w.OutputTokensDetails),
		"usage.completion_tokens_details.reasoning_tokens", "usage.output_tokens_details.reasoning_tokens"); err != nil {
		return u, err
	}
	if err := anthropicCache(&u, names, w.CacheReadInputTokens, w.CacheCreationInputTokens, w.CacheCreation); err != nil {
		return u, err
	}
	if w.ServiceTier != nil {
		if u.Tier = estimator.ReadServiceTier(*w.ServiceTier); u.Tier == "" {
			return u, invalid("usage.service_tier", estimator.TierReason+" (or a provider's name for one: standard, ON_DEMAND, ON_DEMAND_FLEX, ON_DEMAND_PRIORITY)")
		}
	}
	var ue *rule.UsageError
	if errors.As(u.Check(), &ue) {
		return u, invalid(names[ue.Field], ue.Reason)
	}
	return u, nil
}

// pick reads a figure a usage may give by either of two names (the same
// figure if both are given), which must be given and within
// rule.InBounds; it returns the figure and the name it came by.
func pick(a, b *int64, aName, bName string) (int64, string, error) {
	switch {
	case a == nil && b == nil:
		return 0, aName, invalid(aName, "required (or "+bName+")")
	case a != nil && b != nil && *a != *b:
		return 0, aName, invalid(bName, "disagrees with "+aName)
	case a == nil:
		a, aName = b, bName
	}
	if !rule.InBounds(*a) {
		return 0, aName, invalid(aName, rule.BoundsReason)
	}
	return *a, aName, nil
}

// pickDetail reads a part of a usage either API may give (the same figure
// if both are given), 0 when neither says; Check judges its bounds.
func pickDetail(a, b *int64, aName, bName string) (int64, string, error) {
	switch {
	case a != nil && b != nil && *a != *b:
		return 0, aName, invalid(bName, "disagrees with "+aName)
	case a != nil:
		return *a, aName, nil
	case b != nil:
		return *b, bName, nil
	}
	return 0, aName, nil
}

func cachedOf(d *cachedDetails) *int64 {
	if d == nil {
		return nil
	}
	return d.CachedTokens
}

func reasoningOf(d *reasoningDetails) *int64 {
	if d == nil {
		return nil
	}
	return d.ReasoningTokens
}

// anthropicCache adds Anthropic's cache counts to u. Anthropic's
// input_tokens excludes them, so a usage copied from its answer states its
// input in three parts: the reads and writes are added to the input, and
// priced at the model's cache weights. A settle that dropped them would
// charge a cached call a fraction of its input (crewAI #6770). Each count
// added up must be within rule.InBounds; the sum is judged by Check.
func anthropicCache(u *rule.Usage, names usageNames, read, creation *int64, split *cacheCreation) error {
	if read == nil && creation == nil && split == nil {
		return nil
	}
	if u.CacheRead > 0 {
		return invalid("usage.cache_read_input_tokens", "cannot be combined with OpenAI's cached_tokens")
	}
	count := func(p *int64, name string) (int64, error) {
		if p == nil {
			return 0, nil
		}
		if !rule.InBounds(*p) {
			return 0, invalid(name, rule.BoundsReason)
		}
		return *p, nil
	}
	var err error
	names[rule.FieldCacheRead] = "usage.cache_read_input_tokens"
	if u.CacheRead, err = count(read, "usage.cache_read_input_tokens"); err != nil {
		return err
	}
	writes, err := count(creation, "usage.cache_creation_input_tokens")
	if err != nil {
		return err
	}
	u.CacheWrite5m = writes
	names[rule.FieldCacheWrite] = "usage.cache_creation_input_tokens"
	if split != nil {
		w5, err := count(split.Ephemeral5m, "usage.cache_creation.ephemeral_5m_input_tokens")
		if err != nil {
			return err
		}
		w1, err := count(split.Ephemeral1h, "usage.cache_creation.ephemeral_1h_input_tokens")
		if err != nil {
			return err
		}
		switch {
		case creation == nil:
			writes = w5 + w1
		case w5+w1 != writes:
			return invalid("usage.cache_creation", "its 5 minute and 1 hour writes must add up to cache_creation_input_tokens")
		}
		u.CacheWrite5m, u.CacheWrite1h = w5, w1
	}
	u.Input += u.CacheRead + writes
	return nil
}
