package api

import (
	"errors"
	"net/http"
	"strconv"

	"github.com/labstack/echo/v5"

	"github.com/tokengate/tokengate/budget/alert"
	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

// Error is the one JSON error shape of the API:
// {"error":{"type":"...","message":"...","field":"..."}}. Handlers return it,
// or a package sentinel that httpError maps to it; only the error handler
// writes it.
type Error struct {
	Status  int    `json:"-"`
	Type    string `json:"type"`
	Message string `json:"message"`
	Field   string `json:"field,omitempty"`
	Limit   string `json:"limit,omitempty"`
	// Level is the tenant whose limit refused: the caller's own, or an
	// ancestor's when budgets nest.
	Level string `json:"level,omitempty"`
	// Model is the model whose own limits refused (input_tokens,
	// output_tokens); Pool the upstream pool (limit pool).
	Model string `json:"model,omitempty"`
	Pool  string `json:"pool,omitempty"`
	// Window names the calendar window that refused (limit
	// period_budget): retry_after_ms is the time to its reset.
	Window       string `json:"window,omitempty"`
	RetryAfterMS *int64 `json:"retry_after_ms,omitempty"`
	// Budget is what an exhausted window (budget_exhausted) spent, its
	// cap and its reset.
	Budget *rule.ExhaustedBudget `json:"budget,omitempty"`
	// RetryNever says refill cannot make room for the request in any
	// useful time (rule.Never): no retry_after_ms and no Retry-After.
	RetryNever bool `json:"retry_never,omitempty"`
	// headers are the response headers the error sets besides
	// Retry-After (an exhausted window's in place of the bucket's).
	headers []rule.Header
}

func (e *Error) Error() string { return e.Type + ": " + e.Message }

// StatusCode lets Echo's response helpers see the intended status.
func (e *Error) StatusCode() int { return e.Status }

type errorBody struct {
	Error    *Error        `json:"error"`
	Estimate *estimateJSON `json:"estimate,omitempty"`
}

// withEstimate attaches the request's estimate to an error, so that a 429 or
// 422 tells the caller what the request would have cost.
type withEstimate struct {
	err      error
	estimate estimateJSON
}

func (w *withEstimate) Error() string { return w.err.Error() }
func (w *withEstimate) Unwrap() error { return w.err }

// invalid builds a 400 for a request field that failed validation.
func invalid(field, message string) *Error {
	return &Error{Status: http.StatusBadRequest, Type: "invalid_request", Message: message, Field: field}
}

// httpError maps any error to the API error it is shown as. It is the single
// place where sentinels become statuses; anything it does not know is a 500
// whose body reveals nothing of the cause.
func httpError(err error) *Error {
	var (
		apiErr    *Error
		rej       *rule.RejectedError
		exhausted *rule.BudgetExhaustedError
		tooLarge  *rule.TooLargeError
		inv       *estimator.InvalidError
		binv      *rule.InvalidError
		limErr    *rule.LimitError
		he        *echo.HTTPError
		throttled *credential.ThrottledError
		alertErr  *alert.FieldError
		usage     *rule.UsageError
		overflow  *rule.OverflowError
		otherFace *rule.OtherFaceError
		scope     *rule.ModelNotAllowedError
	)
	switch {
	case errors.As(err, &apiErr):
		return apiErr
	case errors.As(err, &throttled):
		ms := rule.RetryAfterMillis(throttled.RetryAfter)
		return &Error{Status: http.StatusTooManyRequests, Type: "rate_limit_exceeded", Limit: "auth",
			Message: "too many unauthenticated or failed requests from this address", RetryAfterMS: &ms}
	case errors.As(err, &exhausted):
		// Out of budget, told apart from a rate limit: 429 like every
		// refusal (the window resets, and OpenAI answers its own quota
		// 429 insufficient_quota), but its own type, its amounts, headers
		// of the window that bound, and X-Should-Retry: false so that no
		// SDK spends its retries on a wait of hours.
		return exhaustedError(exhausted)
	case errors.As(err, &rej) && rej.Never():
		of := ""
		if rej.Level != "" {
			of = " of " + rej.Level
		}
		return &Error{Status: http.StatusTooManyRequests, Type: "rate_limit_exceeded", Limit: string(rej.Limit), Level: rej.Level, Model: rej.Model, Pool: rej.Pool,
			RetryNever: true, headers: []rule.Header{{Name: "X-Should-Retry", Value: "false"}},
			Message: "rejected by the " + rej.Named() + " limit" + of + ", which refills too slowly ever to make room for this request; only a release of open reservations or a change of the limits can"}
	case errors.As(err, &rej):
		ms := rule.RetryAfterMillis(rej.RetryAfter)
		of := ""
		if rej.Model != "" {
			of = " for " + rej.Model
		}
		if rej.Level != "" {
			of += " of " + rej.Level
		}
		if rej.Pool != "" {
			of = " of the upstream pool " + rej.Pool
		}
		return &Error{Status: http.StatusTooManyRequests, Type: "rate_limit_exceeded", Limit: string(rej.Limit), Level: rej.Level, Model: rej.Model, Pool: rej.Pool, Window: rej.Window,
			Message: "rejected by the " + rej.Named() + " limit" + of + "; retry after " + strconv.FormatInt(ms, 10) + " ms", RetryAfterMS: &ms}
	case errors.As(err, &tooLarge):
		return &Error{Status: http.StatusUnprocessableEntity, Type: "request_too_large", Limit: string(tooLarge.Limit), Level: tooLarge.Level, Model: tooLarge.Model, Pool: tooLarge.Pool,
			Window: tooLarge.Window, Message: tooLarge.Error()}
	case errors.As(err, &scope):
		return modelNotAllowed(scope)
	case errors.As(err, &usage):
		return &Error{Status: http.StatusUnprocessableEntity, Type: "usage_out_of_bounds", Field: "usage." + usage.Field,
			Message: usage.Reason + "; no request could have produced this usage, and nothing was charged"}
	case errors.As(err, &overflow):
		return &Error{Status: http.StatusUnprocessableEntity, Type: "amount_out_of_range", Field: overflow.Field,
			Message: "the amount is out of range: " + overflow.Op + "; nothing was changed"}
	case errors.Is(err, rule.ErrDebtFloor):
		return &Error{Status: http.StatusUnprocessableEntity, Type: "debt_floor", Field: "tokens",
			Message: "this debit would take the balance below the debt floor, minus one tokens capacity; nothing was changed"}
	case errors.As(err, &inv):
		return invalid(inv.Field, inv.Reason)
	case errors.As(err, &binv):
		return invalid(binv.Field, binv.Reason)
	case errors.As(err, &limErr):
		return invalid(limErr.Field, limErr.Reason)
	case errors.As(err, &alertErr):
		return invalid(alertErr.Field, alertErr.Reason)
	case errors.Is(err, alert.ErrNotFound):
		return &Error{Status: http.StatusNotFound, Type: "not_found", Message: "no such alert endpoint, rule or event (or it is not in a state that allows this)"}
	case errors.Is(err, alert.ErrNoKey):
		return &Error{Status: http.StatusConflict, Type: "alerts_not_configured",
			Message: "this server has no alert key (TOKENGATE_ALERT_KEY): endpoints cannot be given signing secrets"}
	case errors.Is(err, rule.ErrNotReplayed):
		ms := int64(1000)
		return &Error{Status: http.StatusServiceUnavailable, Type: "admission_not_replayed", RetryAfterMS: &ms,
			Message: "this admission was made by a replica on its own during a store outage and is not in the store yet; retry shortly"}
	case errors.Is(err, rule.ErrAdmissionNotFound):
		return &Error{Status: http.StatusNotFound, Type: "not_found", Message: "no such admission"}
	case errors.Is(err, rule.ErrPoolNotFound):
		return &Error{Status: http.StatusNotFound, Type: "not_found", Message: "no such pool"}
	case errors.Is(err, rule.ErrModelLimitsNotFound):
		return &Error{Status: http.StatusNotFound, Type: "not_found", Message: "the tenant has no limits for this model"}
	case errors.Is(err, rule.ErrEndUserCap):
		return &Error{Status: http.StatusTooManyRequests, Type: "end_user_cap", Limit: "end_user_cap",
			Message: "the tenant has as many end users as its end-user policy allows (max_end_users); a new end user is admitted once an idle one expires"}
	case errors.Is(err, rule.ErrNoEndUserPolicy):
		return &Error{Status: http.StatusNotFound, Type: "not_found", Message: "the tenant has no end-user policy"}
	case errors.Is(err, rule.ErrTenantNotFound):
		return &Error{Status: http.StatusNotFound, Type: "not_found", Message: "no such tenant"}
	case errors.As(err, &otherFace):
		// 409, not 404: the admission is the caller's own tenant's (another
		// tenant's is never found, and answered 404), its id came to the
		// caller from its own traffic or ledger, and "no such admission"
		// would send an honest client looking for a wrong id. What refuses
		// it is its state: it belongs to the face that made it, which ends
		// it from the upstream's usage.
		return &Error{Status: http.StatusConflict, Type: "admission_other_face", Field: "id",
			Message: "admission " + otherFace.AdmissionID + " was made through the " + string(otherFace.Face) +
				" face, which settles or releases it itself; only that face may end it, and nothing was changed"}
	case errors.Is(err, rule.ErrConflict):
		return &Error{Status: http.StatusConflict, Type: "conflict", Message: "the admission was already settled with different usage, or released"}
	case errors.Is(err, estimator.ErrModelExists):
		return &Error{Status: http.StatusConflict, Type: "conflict", Field: "name", Message: "a model with this name exists; PATCH /v1/admin/models/{name} changes it"}
	case errors.Is(err, rule.ErrIdempotencyMismatch):
		return &Error{Status: http.StatusConflict, Type: "idempotency_conflict", Field: "Idempotency-Key",
			Message: "this Idempotency-Key was used in the last 24 h for a different request"}
	case errors.Is(err, rule.ErrTenantDisabled), errors.Is(err, credential.ErrTenantDisabled):
		return &Error{Status: http.StatusForbidden, Type: "tenant_disabled", Message: "the tenant is disabled"}
	case errors.Is(err, rule.ErrOutcomeUnknown):
		ms := int64(1000)
		return &Error{Status: http.StatusServiceUnavailable, Type: "store_outcome_unknown", RetryAfterMS: &ms,
			Message: "the store failed while committing: the admission may or may not have been made; retry with the same Idempotency-Key to find out without a second debit"}
	case errors.Is(err, rule.ErrUnavailable):
		ms := int64(1000)
		return &Error{Status: http.StatusServiceUnavailable, Type: "store_unavailable", RetryAfterMS: &ms,
			Message: "the quota store is unreachable and this request's failure policy is reject"}
	case errors.Is(err, estimator.ErrBusy):
		ms := int64(1000)
		return &Error{Status: http.StatusServiceUnavailable, Type: "estimator_busy", RetryAfterMS: &ms,
			Message: "this replica is estimating as many request bytes as it allows (or this tenant's share of them), and this request's turn did not come in time; retry shortly"}
	case errors.Is(err, rule.ErrBusy):
		ms := int64(1000)
		return &Error{Status: http.StatusServiceUnavailable, Type: "store_busy", RetryAfterMS: &ms,
			Message: "no database connection became free in time"}
	case errors.Is(err, credential.ErrKeyInvalid), errors.Is(err, rule.ErrKeyRevoked):
		return &Error{Status: http.StatusUnauthorized, Type: "unauthorized", Message: "missing or invalid API key"}
	case errors.As(err, &he):
		return fromStatus(he.Code, he.Message)
	}
	if e := storeRefused(err); e != nil {
		return e
	}
	if code := echo.StatusCode(err); code != 0 {
		return fromStatus(code, "")
	}
	return &Error{Status: http.StatusInternalServerError, Type: "internal_error", Message: "internal server error"}
}

func fromStatus(code int, message string) *Error {
	if message == "" {
		message = http.StatusText(code)
	}
	typ := "invalid_request"
	switch code {
	case http.StatusNotFound:
		typ = "not_found"
	case http.StatusMethodNotAllowed:
		typ = "method_not_allowed"
	case http.StatusRequestTimeout:
		typ = "request_timeout"
	case http.StatusRequestEntityTooLarge:
		typ = "body_too_large"
		message = "request body is larger than the server accepts"
	case http.StatusUnsupportedMediaType:
		typ = "unsupported_media_type"
	case http.StatusUnauthorized:
		typ = "unauthorized"
	case http.StatusForbidden:
		typ = "forbidden"
	case http.StatusTooManyRequests:
		typ = "rate_limit_exceeded"
	case http.StatusServiceUnavailable:
		typ = "unavailable"
	}
	if code >= 500 && code != http.StatusServiceUnavailable {
		typ, message = "internal_error", "internal server error"
	}
	return &Error{Status: code, Type: typ, Message: message}
}

// handleError is Echo's HTTPErrorHandler. Server errors are logged with their
// cause and request id; clients see only the mapped error.
func (s *Server) handleError(c *echo.Context, err error) {
	if r, _ := echo.UnwrapResponse(c.Response()); r != nil && r.Committed {
		return
	}
	e := httpError(err)
	if e.Status >= 500 {
		s.logger.ErrorContext(c.Request().Context(), "request failed",
			"error", err.Error(), "method", c.Request().Method, "path", c.Path(),
			"request_id", c.Response().Header().Get(echo.HeaderXRequestID))
	}
	if e.RetryAfterMS != nil {
		// In seconds, from the milliseconds without a Duration: a long
		// wait once overflowed it and said 1.
		c.Response().Header().Set("Retry-After", strconv.FormatInt(max(1, (*e.RetryAfterMS+999)/1000), 10))
	}
	for _, h := range e.headers {
		c.Response().Header().Set(h.Name, h.Value)
	}
	if e.Status == http.StatusUnauthorized {
		c.Response().Header().Set("WWW-Authenticate", `Bearer realm="tokengate"`)
	}
	if c.Request().Method == http.MethodHead {
		_ = c.NoContent(e.Status)
		return
	}
	body := errorBody{Error: e}
	var we *withEstimate
	if errors.As(err, &we) {
		body.Estimate = &we.estimate
	}
	_ = c.JSON(e.Status, body)
}

// exhaustedError is the API's answer to an exhausted budget window.
func exhaustedError(e *rule.BudgetExhaustedError) *Error {
	ms := rule.RetryAfterMillis(e.RetryAfter)
	return &Error{Status: http.StatusTooManyRequests, Type: "budget_exhausted", Limit: string(e.Limit), Level: e.Level, Window: e.Window,
		RetryAfterMS: &ms, Budget: e.Amounts(), headers: append(e.RateHeaders(), rule.Header{Name: "X-Should-Retry", Value: "false"}),
		Message: e.Message()}
}

// modelNotAllowed is a model outside a model scope: 403, since no balance
// or wait changes it, with the model and the field that named it.
func modelNotAllowed(e *rule.ModelNotAllowedError) *Error {
	return &Error{Status: http.StatusForbidden, Type: "model_not_allowed", Limit: string(rule.LimitModelScope), Level: e.Level, Model: e.Model, Field: e.FieldOr(),
		RetryNever: true, headers: []rule.Header{{Name: "X-Should-Retry", Value: "false"}},
		Message: e.Message()}
}
