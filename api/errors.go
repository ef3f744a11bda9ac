package api

import (
	"errors"
	"net/http"

	"github.com/labstack/echo/v5"
)

// Error is the one JSON error shape of the API:
// {"error":{"type":"...","message":"...","field":"..."}}. Handlers return it
// (or a sentinel that httpError maps to it); only the error handler writes it.
type Error struct {
	Status  int    `json:"-"`
	Type    string `json:"type"`
	Message string `json:"message"`
	Field   string `json:"field,omitempty"`
}

func (e *Error) Error() string { return e.Type + ": " + e.Message }

// StatusCode lets Echo's response helpers see the intended status.
func (e *Error) StatusCode() int { return e.Status }

type errorBody struct {
	Error *Error `json:"error"`
}

// invalid builds a 400 for a request field that failed validation.
func invalid(field, message string) *Error {
	return &Error{Status: http.StatusBadRequest, Type: "invalid_request", Message: message, Field: field}
}

// httpError maps any error to the API error it should be shown as. It is the
// single place where sentinels become statuses; anything it does not know is
// a 500 whose body reveals nothing of the cause.
func httpError(err error) *Error {
	var apiErr *Error
	if errors.As(err, &apiErr) {
		return apiErr
	}
	var he *echo.HTTPError
	if errors.As(err, &he) {
		return fromStatus(he.Code, he.Message)
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
	case http.StatusRequestEntityTooLarge:
		typ = "request_too_large"
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
// cause (and the request id, via the request logger); clients see only the
// mapped error.
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
	if c.Request().Method == http.MethodHead {
		_ = c.NoContent(e.Status)
		return
	}
	_ = c.JSON(e.Status, errorBody{Error: e})
}
