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

	"github.com/tokengate/tokengate/budget/account"
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

// parse reads and parses a request body, holding its bytes of the
// replica's estimate gate: release gives them back once the body is
// estimated (the caller's, and deferred by it too). The body's route does
// not say what API it is, so the use case's model table decides
// (admission.Admitter.ParseFor); estimating and pricing it are the use
// case's (Admit, Quote), before any transaction begins.
func (s *Server) parse(c *echo.Context) (req *estimator.Request, body []byte, release func(), err error) {
	// The replica's estimate gate bounds the bytes read, parsed and
	// counted at once, on every face; this tenant's share of it leaves the
	// rest to the others. A body is read only once its bytes are taken, so
	// that the callers waiting their turn hold no memory.
	release, err = s.gate.Acquire(c.Request().Context(), tenantOf(c), bodyBytes(c.Request(), s.cfg.BodyLimit))
	if err != nil {
		// Past the wait, or the caller gone while it waited (whom no
		// answer reaches, and who is not a server error).
		return nil, nil, func() {}, estimator.ErrBusy
	}
	body, err = readBody(c)
	if err != nil {
		return nil, nil, release, err
	}
	req, err = s.admitter.ParseFor(body)
	return req, body, release, err
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
	req, body, release, err := s.parse(c)
	defer release()
	if err != nil {
		if !errors.Is(err, estimator.ErrBusy) {
			s.admitter.Invalid(admission.FaceAPI, start)
		}
		return err
	}
	p := account.ReserveParams{
		TenantID: tenantID, IdempotencyKey: key, Actor: "key:" + keyOf(c), KeyID: keyOf(c),
	}
	ad, err := s.admitter.Admit(c.Request().Context(), admission.AdmitRequest{Parsed: req, EstimatedFunc: release,
		Request: admission.Request{ReserveParams: p, Face: admission.FaceAPI, Start: start, Body: body,
			EndUser: admission.EndUser{HeaderFunc: c.Request().Header.Get}}})
	if !ad.Decided {
		return err // its estimate refused it: counted as invalid by the use case
	}
	if ad.Local {
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
		return &withEstimate{err: err, estimate: estimateOf(ad.Estimate)}
	}
	r := ad.Reservation
	if r.Replayed {
		c.Response().Header().Set("Idempotent-Replayed", "true")
	}
	s.setRateHeaders(c, r.Snapshot)
	a := admittedJSON{
		ID: r.AdmissionID, Admitted: true, Model: r.Estimate.Model, Estimate: estimateOf(r.Estimate),
		CreatedAt: r.CreatedAt, ExpiresAt: r.ExpiresAt, Remaining: remainingOf(r.Snapshot),
	}
	if b, ok := a.appendJSON(make([]byte, 0, 320)); ok {
		return c.JSONBlob(http.StatusCreated, b)
	}
	return c.JSON(http.StatusCreated, a)
}

func keyOf(c *echo.Context) string {
	id, _ := c.Get(ctxKeyID).(string)
	return id
}

// postEstimate is POST /v1/estimate: the estimate alone, debiting nothing.
func (s *Server) postEstimate(c *echo.Context) error {
	req, _, release, err := s.parse(c)
	defer release()
	if err != nil {
		return err
	}
	est, err := s.admitter.Quote(req)
	release()
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
	State     account.State `json:"state"`
	Late      bool          `json:"late"`
	Model     string        `json:"model"`
	Estimate  estimateJSON  `json:"estimate"`
	Actual    *usageJSON    `json:"actual"`
	Delta     int64         `json:"delta"`
	Applied   json.Number   `json:"applied_delta"`
	Balance   json.Number   `json:"balance"`
	Remaining remainingJSON `json:"remaining"`
}

func endedOf(st *account.Settlement) endedJSON {
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

func (s *Server) releaseAdmission(c *echo.Context) error {
	if _, err := readBody(c); err != nil {
		return err
	}
	st, journaled, err := s.admitter.Release(c.Request().Context(), admission.FaceAPI, account.ReleaseParams{
		TenantID: tenantOf(c), AdmissionID: c.Param("id"), Actor: "key:" + keyOf(c), KeyID: keyOf(c),
	})
	return s.ended(c, "release", st, journaled, err)
}

// ended answers a settle or release: its result, or 202 when the store is
// unreachable and it was journaled (the accounting is kept, the balance is
// not known yet).
func (s *Server) ended(c *echo.Context, kind string, st *account.Settlement, journaled bool, err error) error {
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
	ID        string        `json:"id"`
	State     account.State `json:"state"`
	Model     string        `json:"model"`
	Estimate  estimateJSON  `json:"estimate"`
	CreatedAt time.Time     `json:"created_at"`
	ExpiresAt time.Time     `json:"expires_at"`
	EndedAt   *time.Time    `json:"ended_at"`
	Late      bool          `json:"late"`
	Actual    *usageJSON    `json:"actual"`
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
