package api

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v5"

	"github.com/tokengate/tokengate/budget"
	"github.com/tokengate/tokengate/budget/admission"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

type estimateJSON struct {
	InputTokens  int64 `json:"input_tokens"`
	OutputTokens int64 `json:"output_tokens"`
	Cost         int64 `json:"cost"`
	Approximate  bool  `json:"approximate"`
}

type remainingJSON struct {
	Tokens       int64  `json:"tokens"`
	Requests     *int64 `json:"requests"`
	PeriodBudget *int64 `json:"period_budget"`
}

type admittedJSON struct {
	ID        string        `json:"id"`
	Admitted  bool          `json:"admitted"`
	Model     string        `json:"model"`
	Estimate  estimateJSON  `json:"estimate"`
	CreatedAt time.Time     `json:"created_at"`
	ExpiresAt time.Time     `json:"expires_at"`
	Remaining remainingJSON `json:"remaining"`
}

func estimateOf(e estimator.Estimate) estimateJSON {
	return estimateJSON{InputTokens: e.InputTokens, OutputTokens: e.OutputTokens, Cost: e.Cost, Approximate: e.Approximate}
}

func remainingOf(s rule.Snapshot) remainingJSON {
	r := remainingJSON{Tokens: s.Tokens()}
	if s.Limits.RequestsCapacity > 0 {
		n := s.Requests()
		r.Requests = &n
	}
	if s.Limits.PeriodBudget > 0 {
		n := s.PeriodRemaining()
		r.PeriodBudget = &n
	}
	return r
}

// idempotencyKey is the Idempotency-Key header, sent at most once. Its
// form is the domain's rule (rule.IdempotencyKeyProblem), which the
// admission layer applies to every face.
func idempotencyKey(r *http.Request) (string, error) {
	values := r.Header.Values("Idempotency-Key")
	switch {
	case len(values) == 0:
		return "", nil
	case len(values) > 1:
		return "", invalid("Idempotency-Key", "send the header once")
	}
	return values[0], nil
}

// readBody reads the request body, which the body-limit middleware bounds
// (413) and the server's body read deadline limits in time (408).
func readBody(c *echo.Context) ([]byte, error) {
	body, err := io.ReadAll(c.Request().Body)
	if err != nil {
		return nil, bodyReadError(err)
	}
	return body, nil
}

// bodyBytes is what a body weighs in the estimate gate before it is read:
// its Content-Length, or the body limit when it is sent in chunks.
func bodyBytes(r *http.Request, limit int64) int64 {
	if r.ContentLength >= 0 {
		return min(r.ContentLength, limit)
	}
	return limit
}

// estimate parses and estimates a request body. Estimation happens here,
// before any transaction begins.
func (s *Server) estimate(c *echo.Context) (*estimator.Request, estimator.Estimate, []byte, error) {
	// The replica's estimate gate bounds the bytes read, parsed and
	// counted at once, on every face; this tenant's share of it leaves the
	// rest to the others. A body is read only once its bytes are taken, so
	// that the callers waiting their turn hold no memory.
	release, err := s.gate.Acquire(c.Request().Context(), tenantOf(c), bodyBytes(c.Request(), s.cfg.BodyLimit))
	if err != nil {
		// Past the wait, or the caller gone while it waited (whom no
		// answer reaches, and who is not a server error).
		return nil, estimator.Estimate{}, nil, estimator.ErrBusy
	}
	defer release()
	body, err := readBody(c)
	if err != nil {
		return nil, estimator.Estimate{}, nil, err
	}
	req, err := s.estimator.ParseFor(body)
	if err != nil {
		return nil, estimator.Estimate{}, nil, err
	}
	est, err := s.estimator.Estimate(req)
	if err != nil {
		return nil, estimator.Estimate{}, nil, err
	}
	return req, est, body, nil
}

// createAdmission is POST /v1/admissions: estimate, then reserve.
func (s *Server) createAdmission(c *echo.Context) error {
	start := time.Now()
	tenantID := tenantOf(c)
	key, err := idempotencyKey(c.Request())
	if err != nil {
		s.admitter.Invalid(admission.FaceAPI, start)
		return err
	}
	req, est, body, err := s.estimate(c)
	if err != nil {
		if !errors.Is(err, estimator.ErrBusy) {
			s.admitter.Invalid(admission.FaceAPI, start)
		}
		return err
	}
	p := budget.ReserveParams{
		TenantID: tenantID, Estimate: est,
		IdempotencyKey: key, Actor: "key:" + keyOf(c), KeyID: keyOf(c),
	}
	r, local, err := s.admitter.Reserve(c.Request().Context(), admission.Request{ReserveParams: p, MaxWait: time.Duration(req.MaxWaitMS()) * time.Millisecond,
		Face: admission.FaceAPI, Start: start, Body: body,
		EndUser: admission.EndUser{Fields: req.EndUserFields(), HeaderFunc: c.Request().Header.Get}})
	if local {
		c.Response().Header().Set("X-Tokengate-Decided-By", "local")
	}
	if err != nil {
		exh, rej := (*rule.BudgetExhaustedError)(nil), (*rule.RejectedError)(nil)
		switch {
		case errors.As(err, &exh):
			// The headers of the window that bound, never the bucket's.
			for _, h := range exh.RateHeaders() {
				c.Response().Header().Set(h.Name, h.Value)
			}
		case errors.As(err, &rej):
			s.setRateHeaders(c, rej.Snapshot)
		}
		return &withEstimate{err: err, estimate: estimateOf(est)}
	}
	if r.Replayed {
		c.Response().Header().Set("Idempotent-Replayed", "true")
	}
	s.setRateHeaders(c, r.Snapshot)
	return c.JSON(http.StatusCreated, admittedJSON{
		ID: r.AdmissionID, Admitted: true, Model: r.Estimate.Model, Estimate: estimateOf(r.Estimate),
		CreatedAt: r.CreatedAt, ExpiresAt: r.ExpiresAt, Remaining: remainingOf(r.Snapshot),
	})
}

func keyOf(c *echo.Context) string {
	id, _ := c.Get(ctxKeyID).(string)
	return id
}

// postEstimate is POST /v1/estimate: the estimate alone, debiting nothing.
func (s *Server) postEstimate(c *echo.Context) error {
	_, est, _, err := s.estimate(c)
	if err != nil {
		return err
	}
	return s.respond(c, http.StatusOK, struct {
		Model    string       `json:"model"`
		Family   string       `json:"family"`
		Estimate estimateJSON `json:"estimate"`
	}{est.Model, est.Family, estimateOf(est)}, nil)
}

type usageJSON struct {
	InputTokens  int64 `json:"input_tokens"`
	OutputTokens int64 `json:"output_tokens"`
	Cost         int64 `json:"cost"`
}

type endedJSON struct {
	ID        string        `json:"id"`
	State     budget.State  `json:"state"`
	Late      bool          `json:"late"`
	Model     string        `json:"model"`
	Estimate  estimateJSON  `json:"estimate"`
	Actual    *usageJSON    `json:"actual"`
	Delta     int64         `json:"delta"`
	Applied   json.Number   `json:"applied_delta"`
	Balance   json.Number   `json:"balance"`
	Remaining remainingJSON `json:"remaining"`
}

func endedOf(st *budget.Settlement) endedJSON {
	a := st.Admission
	out := endedJSON{
		ID: a.ID, State: a.State, Late: a.Late, Model: a.Estimate.Model, Estimate: estimateOf(a.Estimate),
		Applied:   json.Number(formatMicro(st.DeltaMicro)),
		Balance:   json.Number(formatMicro(st.BalanceMicro)),
		Remaining: remainingOf(st.Snapshot),
	}
	if a.ActualCost != nil {
		out.Delta = a.Estimate.Cost - *a.ActualCost
	}
	if a.ActualInput != nil && a.ActualOutput != nil && a.ActualCost != nil {
		out.Actual = &usageJSON{InputTokens: *a.ActualInput, OutputTokens: *a.ActualOutput, Cost: *a.ActualCost}
	}
	return out
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

// settleUsage is a settle's usage: in is every input token, of which
// cached were served from the provider's cache, and write5m and write1h
// written to it (Anthropic's cache writes, for 5 minutes and for an hour);
// out is every output token, of which reasoning were spent reasoning.
type settleUsage struct{ in, out, cached, write5m, write1h, reasoning int64 }

const maxUsageTokens = 1_000_000_000

func parseUsage(body []byte) (u settleUsage, err error) {
	var sb settleBody
	if err := decodeJSON(body, &sb); err != nil {
		return u, err
	}
	if sb.Usage == nil {
		return u, invalid("usage", "required: {\"usage\":{\"prompt_tokens\":N,\"completion_tokens\":N}}")
	}
	pick := func(a, b *int64, aName, bName string) (int64, error) {
		switch {
		case a == nil && b == nil:
			return 0, invalid("usage."+aName, "required (or usage."+bName+")")
		case a != nil && b != nil && *a != *b:
			return 0, invalid("usage."+bName, "disagrees with usage."+aName)
		case a == nil:
			a = b
			aName = bName
		}
		if *a < 0 || *a > maxUsageTokens {
			return 0, invalid("usage."+aName, "must be between 0 and 1000000000")
		}
		return *a, nil
	}
	w := sb.Usage
	if u.in, err = pick(w.PromptTokens, w.InputTokens, "prompt_tokens", "input_tokens"); err != nil {
		return u, err
	}
	if u.out, err = pick(w.CompletionTokens, w.OutputTokens, "completion_tokens", "output_tokens"); err != nil {
		return u, err
	}
	for _, d := range []struct {
		name    string
		details *cachedDetails
	}{{"prompt_tokens_details", w.PromptTokensDetails}, {"input_tokens_details", w.InputTokensDetails}} {
		if d.details == nil || d.details.CachedTokens == nil {
			continue
		}
		if c := *d.details.CachedTokens; c < 0 || c > u.in {
			return u, invalid("usage."+d.name+".cached_tokens", "must be between 0 and the input tokens")
		}
		u.cached = *d.details.CachedTokens
	}
	if u.reasoning, err = reasoningTokens(u.out, w.CompletionTokensDetails, w.OutputTokensDetails); err != nil {
		return u, err
	}
	return anthropicCache(u, w.CacheReadInputTokens, w.CacheCreationInputTokens, w.CacheCreation)
}

// reasoningTokens reads the part of out output tokens spent reasoning,
// by either API's name (the same figure if both are given), 0 when
// neither says.
func reasoningTokens(out int64, chat, responses *reasoningDetails) (int64, error) {
	var c, r *int64
	if chat != nil {
		c = chat.ReasoningTokens
	}
	if responses != nil {
		r = responses.ReasoningTokens
	}
	switch {
	case c != nil && r != nil && *c != *r:
		return 0, invalid("usage.output_tokens_details.reasoning_tokens", "disagrees with usage.completion_tokens_details.reasoning_tokens")
	case c != nil:
		if *c < 0 || *c > out {
			return 0, invalid("usage.completion_tokens_details.reasoning_tokens", "must be between 0 and the output tokens")
		}
		return *c, nil
	case r != nil:
		if *r < 0 || *r > out {
			return 0, invalid("usage.output_tokens_details.reasoning_tokens", "must be between 0 and the output tokens")
		}
		return *r, nil
	}
	return 0, nil
}

// anthropicCache adds Anthropic's cache counts to u. Anthropic's
// input_tokens excludes them, so a usage copied from its answer states its
// input in three parts: the reads and writes are added to the input, and
// priced at the model's cache weights. A settle that dropped them would
// charge a cached call a fraction of its input (crewAI #6770).
func anthropicCache(u settleUsage, read, creation *int64, split *cacheCreation) (settleUsage, error) {
	if read == nil && creation == nil && split == nil {
		return u, nil
	}
	if u.cached > 0 {
		return u, invalid("usage.cache_read_input_tokens", "cannot be combined with OpenAI's cached_tokens")
	}
	count := func(p *int64, name string) (int64, error) {
		if p == nil {
			return 0, nil
		}
		if *p < 0 || *p > maxUsageTokens {
			return 0, invalid("usage."+name, "must be between 0 and 1000000000")
		}
		return *p, nil
	}
	var err error
	if u.cached, err = count(read, "cache_read_input_tokens"); err != nil {
		return u, err
	}
	writes, err := count(creation, "cache_creation_input_tokens")
	if err != nil {
		return u, err
	}
	u.write5m = writes
	if split != nil {
		w5, err := count(split.Ephemeral5m, "cache_creation.ephemeral_5m_input_tokens")
		if err != nil {
			return u, err
		}
		w1, err := count(split.Ephemeral1h, "cache_creation.ephemeral_1h_input_tokens")
		if err != nil {
			return u, err
		}
		switch {
		case creation == nil:
			writes = w5 + w1
		case w5+w1 != writes:
			return u, invalid("usage.cache_creation", "its 5 minute and 1 hour writes must add up to cache_creation_input_tokens")
		}
		u.write5m, u.write1h = w5, w1
	}
	u.in += u.cached + writes
	if u.in > maxUsageTokens {
		return u, invalid("usage.input_tokens", "with the cache's tokens, must be at most 1000000000")
	}
	return u, nil
}

// decodeJSON decodes a small JSON body, naming the field of a type error.
func decodeJSON(body []byte, v any) error {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	err := json.Unmarshal(body, v)
	switch {
	case err == nil:
		return nil
	case errors.As(err, &typ):
		field := typ.Field
		if field == "" {
			field = "body"
		}
		return invalid(field, "must be "+jsonKind(typ.Type.Kind().String()))
	case errors.As(err, &syn):
		return invalid("body", "malformed JSON at byte "+strconv.FormatInt(syn.Offset, 10))
	default:
		return invalid("body", "malformed JSON")
	}
}

func jsonKind(k string) string {
	switch {
	case strings.HasPrefix(k, "int"), strings.HasPrefix(k, "uint"):
		return "an integer"
	case k == "struct", k == "map", k == "ptr":
		return "an object"
	case k == "string":
		return "a string"
	}
	return "of another type (" + k + ")"
}

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
	st, journaled, err := s.admitter.Settle(c.Request().Context(), admission.FaceAPI, budget.SettleParams{
		TenantID: tenantOf(c), AdmissionID: c.Param("id"), InputTokens: u.in, OutputTokens: u.out, CachedInputTokens: u.cached,
		CacheWriteTokens: u.write5m, CacheWrite1hTokens: u.write1h, ReasoningTokens: u.reasoning, Actor: "key:" + keyOf(c), KeyID: keyOf(c),
	})
	return s.ended(c, "settle", st, journaled, err)
}

func (s *Server) releaseAdmission(c *echo.Context) error {
	if _, err := readBody(c); err != nil {
		return err
	}
	st, journaled, err := s.admitter.Release(c.Request().Context(), admission.FaceAPI, budget.ReleaseParams{
		TenantID: tenantOf(c), AdmissionID: c.Param("id"), Actor: "key:" + keyOf(c), KeyID: keyOf(c),
	})
	return s.ended(c, "release", st, journaled, err)
}

// ended answers a settle or release: its result, or 202 when the store is
// unreachable and it was journaled (the accounting is kept, the balance is
// not known yet).
func (s *Server) ended(c *echo.Context, kind string, st *budget.Settlement, journaled bool, err error) error {
	switch {
	case err != nil:
		return err
	case journaled:
		return c.JSON(http.StatusAccepted, map[string]string{
			"id": c.Param("id"), "state": "pending",
			"message": "the store is unreachable; this " + kind + " is journaled and applied when it is back",
		})
	}
	return s.respond(c, http.StatusOK, endedOf(st), &st.Snapshot)
}

type admissionJSON struct {
	ID        string       `json:"id"`
	State     budget.State `json:"state"`
	Model     string       `json:"model"`
	Estimate  estimateJSON `json:"estimate"`
	CreatedAt time.Time    `json:"created_at"`
	ExpiresAt time.Time    `json:"expires_at"`
	EndedAt   *time.Time   `json:"ended_at"`
	Late      bool         `json:"late"`
	Actual    *usageJSON   `json:"actual"`
}

func (s *Server) getAdmission(c *echo.Context) error {
	ctx := c.Request().Context()
	a, err := s.admin.Admission(ctx, tenantOf(c), c.Param("id"))
	if err != nil {
		return err
	}
	out := admissionJSON{
		ID: a.ID, State: a.State, Model: a.Estimate.Model, Estimate: estimateOf(a.Estimate),
		CreatedAt: a.CreatedAt, ExpiresAt: a.ExpiresAt, EndedAt: a.EndedAt, Late: a.Late,
	}
	if a.ActualCost != nil {
		out.Actual = &usageJSON{Cost: *a.ActualCost}
		if a.ActualInput != nil && a.ActualOutput != nil {
			out.Actual.InputTokens, out.Actual.OutputTokens = *a.ActualInput, *a.ActualOutput
		}
	}
	return s.respond(c, http.StatusOK, out, nil)
}
