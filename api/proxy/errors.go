package proxy

import (
	"errors"
	"net/http"
	"os"
	"strconv"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

// code is what went wrong with a call, in the proxy's own words: the one
// error table below maps every failure to a code, and each wire's dialect
// says how a code looks on it (shape).
type code int

const (
	codeInternal        code = iota // anything unexpected: a 500, no internals
	codeNotFound                    // a route the proxy does not serve
	codeMethod                      // not a POST
	codeInvalid                     // an invalid request (param names its field)
	codeBodyTooLarge                // a body past Config.BodyLimit
	codeBodyTimeout                 // a body past the server's read deadline
	codeReplayed                    // an Idempotency-Key admitted already
	codeKeyMismatch                 // an Idempotency-Key of another request
	codeOtherFace                   // an admission of another face
	codeExhausted                   // a spent budget window
	codeRejected                    // a limit without room
	codeThrottled                   // too many failed authentications
	codeTooLarge                    // a request no limit could ever hold
	codeBadKey                      // an unknown or revoked key
	codeDisabled                    // a disabled tenant
	codeEndUserCap                  // no room for a new end user
	codeBusy                        // not estimated in time
	codeUnavailable                 // the domain cannot decide now
	codeUpstream                    // the upstream failed or broke off
	codeUnserved                    // a path of a wire's API the proxy does not serve
	codeModelNotAllowed             // a model outside the key's or tenant's scope
)

// statuses is each code's HTTP status, as a wire answers it unless its
// shape says otherwise.
var statuses = map[code]int{
	codeInternal: http.StatusInternalServerError, codeNotFound: http.StatusNotFound, codeMethod: http.StatusMethodNotAllowed,
	codeInvalid: http.StatusBadRequest, codeBodyTooLarge: http.StatusRequestEntityTooLarge, codeBodyTimeout: http.StatusRequestTimeout,
	codeReplayed: http.StatusConflict, codeKeyMismatch: http.StatusConflict, codeOtherFace: http.StatusConflict,
	codeExhausted: http.StatusTooManyRequests, codeRejected: http.StatusTooManyRequests, codeThrottled: http.StatusTooManyRequests,
	codeTooLarge: http.StatusUnprocessableEntity, codeBadKey: http.StatusUnauthorized, codeDisabled: http.StatusForbidden,
	codeEndUserCap: http.StatusTooManyRequests, codeBusy: http.StatusServiceUnavailable, codeUnavailable: http.StatusServiceUnavailable,
	codeUpstream:        http.StatusBadGateway,
	codeUnserved:        http.StatusNotFound,
	codeModelNotAllowed: http.StatusForbidden,
}

// shape is how a code looks on a wire.
type shape struct {
	status int    // 0: the code's (statuses)
	typ    string // the wire's error type
	// prefix comes before the message; message, when set, replaces it.
	prefix, message string
	// bare leaves the param out of the message on a wire that writes it
	// there (Anthropic's has no field for it).
	bare bool
	// noRetry sets X-Should-Retry: false, which the wire's SDKs honour.
	noRetry bool
}

// shapeIn is c's shape in a wire's table, else other.
func shapeIn(table map[code]shape, c code, other shape) shape {
	if s, ok := table[c]; ok {
		return s
	}
	return other
}

// problem is one failure to answer: its code, the request's field at
// fault and the words for the caller.
type problem struct {
	code           code
	param, message string
}

// fail answers pr in d's terms.
func fail(w http.ResponseWriter, d dialect, pr problem) {
	s := d.shape(pr.code)
	msg := pr.message
	if s.message != "" {
		msg = s.message
	}
	param := pr.param
	if s.bare {
		param = ""
	}
	if s.noRetry {
		w.Header().Set("X-Should-Retry", "false")
	}
	status := s.status
	if status == 0 {
		status = statuses[pr.code]
	}
	d.writeError(w, status, s.typ, param, s.prefix+msg)
}

// requestProblem is the problem of a request its wire cannot read: an
// *estimator.InvalidError names its field.
func requestProblem(err error) problem {
	var inv *estimator.InvalidError
	if errors.As(err, &inv) {
		return problem{code: codeInvalid, param: inv.Field, message: inv.Reason}
	}
	return problem{code: codeInvalid, message: "the request could not be read"}
}

// bodyProblem is the problem of a body that could not be read: past the
// limit (a chunked body as one with a Content-Length), past the server's
// body read deadline (the connection is then closed), or broken off.
func bodyProblem(h http.Header, err error) problem {
	var mb *http.MaxBytesError
	switch {
	case errors.As(err, &mb):
		return problem{code: codeBodyTooLarge, message: "the request body is larger than the proxy accepts"}
	case errors.Is(err, os.ErrDeadlineExceeded):
		h.Set("Connection", "close")
		return problem{code: codeBodyTimeout, message: "the request body did not arrive within the proxy's body read timeout"}
	}
	h.Set("Connection", "close")
	return problem{code: codeInvalid, message: "the request body could not be read"}
}

// writeDomainError answers an error of the domain in d's terms: the one
// table of the proxy's refusals. A refusal carries the wire's rate
// headers and retry-after and retry-after-ms (the SDKs' own retry honours
// them, and waits exactly long enough); an exhausted budget window the
// headers of the window that bound and x-should-retry: false (a wait of
// hours is no retry); a refill that can never make room says so, with no
// retry-after at all.
func writeDomainError(w http.ResponseWriter, d dialect, err error) {
	fail(w, d, domainProblem(w.Header(), d, err))
}

func domainProblem(h http.Header, d dialect, err error) problem {
	var exh *rule.BudgetExhaustedError
	var rej *rule.RejectedError
	var tl *rule.TooLargeError
	var thr *credential.ThrottledError
	var inv *rule.InvalidError
	var other *rule.OtherFaceError
	var scope *rule.ModelNotAllowedError
	switch {
	case errors.As(err, &scope):
		// No balance or wait changes it: 403, never retried.
		return problem{code: codeModelNotAllowed, param: scope.FieldOr(), message: "tokengate: model_not_allowed: " + scope.Message()}
	case errors.As(err, &inv):
		return problem{code: codeInvalid, param: inv.Field, message: inv.Reason}
	case errors.As(err, &other):
		// As the HTTP API answers it (409): the proxy ends only what it
		// admitted, so no proxy call meets it today.
		return problem{code: codeOtherFace,
			message: "admission " + other.AdmissionID + " was made through the " + string(other.Face) + " face; only that face may end it"}
	case errors.As(err, &exh):
		setExhaustedHeaders(h, exh)
		d.exhaustedHeaders(h, exh)
		return problem{code: codeExhausted, message: exh.Message()}
	case errors.As(err, &rej) && rej.Never():
		d.rateHeaders(h, rej.Snapshot)
		h.Set("X-Should-Retry", "false")
		return problem{code: codeRejected, message: "tokengate: rejected by the tenant's " + rej.Named() +
			" limit, which refills too slowly ever to make room for this request; only a release of open reservations or a change of the limits can"}
	case errors.As(err, &rej):
		d.rateHeaders(h, rej.Snapshot)
		ms := rule.RetryAfterMillis(rej.RetryAfter)
		h.Set("Retry-After", strconv.FormatInt(rule.RetryAfterSeconds(rej.RetryAfter), 10))
		h.Set("Retry-After-Ms", strconv.FormatInt(ms, 10))
		return problem{code: codeRejected, message: "tokengate: rejected by the tenant's " + rej.Named() + " limit; retry after " + strconv.FormatInt(ms, 10) + " ms"}
	case errors.As(err, &thr):
		h.Set("Retry-After", strconv.FormatInt(rule.RetryAfterSeconds(thr.RetryAfter), 10))
		return problem{code: codeThrottled, message: "too many failed authentications from this address"}
	case errors.As(err, &tl):
		// Well formed, but it can never fit the tenant's limits: no SDK
		// retries it.
		return problem{code: codeTooLarge, message: tl.Error()}
	case account.IsInvalidInput(err):
		return problem{code: codeInvalid, message: "a text value of the request cannot be stored (a NUL character, a character outside UTF-8, or too long)"}
	case errors.Is(err, credential.ErrKeyInvalid), errors.Is(err, rule.ErrKeyRevoked):
		return problem{code: codeBadKey}
	case errors.Is(err, credential.ErrTenantDisabled), errors.Is(err, rule.ErrTenantDisabled):
		return problem{code: codeDisabled, message: "the tenant is disabled"}
	case errors.Is(err, rule.ErrEndUserCap):
		return problem{code: codeEndUserCap, message: "the tenant has as many end users as its end-user policy allows (max_end_users); a new end user is admitted once an idle one expires"}
	case errors.Is(err, rule.ErrIdempotencyMismatch):
		return problem{code: codeKeyMismatch, param: "Idempotency-Key", message: "this Idempotency-Key was used for another request"}
	case errors.Is(err, estimator.ErrBusy):
		h.Set("Retry-After", "1")
		h.Set("Retry-After-Ms", "1000")
		return problem{code: codeBusy, message: err.Error() + " (or this tenant's share of them), and this request's turn did not come in time; retry shortly"}
	case errors.Is(err, rule.ErrUnavailable), errors.Is(err, rule.ErrBusy):
		h.Set("Retry-After", "1")
		return problem{code: codeUnavailable, message: "tokengate cannot decide now: " + err.Error()}
	}
	return problem{code: codeInternal, message: "internal error"}
}
