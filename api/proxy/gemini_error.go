package proxy

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
)

// geminiShapes is Google's answer to each problem, as google.rpc.Status:
// typ is its status and the ErrorInfo's reason, "STATUS/REASON". A refusal
// is a 429 RESOURCE_EXHAUSTED with a RetryInfo stating the wait, which
// Google's SDKs (with their retry options on) retry; a request that can
// never fit is a 400 FAILED_PRECONDITION, which none retries; bad input a
// 400 INVALID_ARGUMENT with a BadRequest naming the field.
var geminiShapes = map[code]shape{
	codeInternal:        {typ: "INTERNAL/INTERNAL"},
	codeNotFound:        {typ: "NOT_FOUND/NOT_FOUND", message: "this tokengate proxy serves no Gemini upstream (--gemini-upstream)"},
	codeMethod:          {typ: "UNIMPLEMENTED/METHOD_NOT_ALLOWED"},
	codeInvalid:         {typ: "INVALID_ARGUMENT/INVALID_ARGUMENT"},
	codeBodyTooLarge:    {typ: "INVALID_ARGUMENT/REQUEST_TOO_LARGE"},
	codeBodyTimeout:     {typ: "DEADLINE_EXCEEDED/BODY_TIMEOUT"},
	codeReplayed:        {typ: "ALREADY_EXISTS/IDEMPOTENCY_KEY_ADMITTED", noRetry: true},
	codeKeyMismatch:     {typ: "ABORTED/IDEMPOTENCY_KEY_MISMATCH", noRetry: true},
	codeOtherFace:       {typ: "ABORTED/OTHER_FACE"},
	codeExhausted:       {typ: "RESOURCE_EXHAUSTED/BUDGET_EXHAUSTED", prefix: "tokengate: budget_exhausted: "},
	codeRejected:        {typ: "RESOURCE_EXHAUSTED/RATE_LIMIT_EXCEEDED"},
	codeThrottled:       {typ: "RESOURCE_EXHAUSTED/AUTHENTICATION_THROTTLED"},
	codeTooLarge:        {status: http.StatusBadRequest, typ: "FAILED_PRECONDITION/REQUEST_NEVER_FITS"},
	codeBadKey:          {typ: "UNAUTHENTICATED/API_KEY_INVALID", message: "invalid tokengate key"},
	codeDisabled:        {typ: "PERMISSION_DENIED/TENANT_DISABLED"},
	codeEndUserCap:      {typ: "RESOURCE_EXHAUSTED/END_USER_CAP", prefix: "end_user_cap: ", noRetry: true},
	codeBusy:            {typ: "UNAVAILABLE/ESTIMATOR_BUSY", prefix: "tokengate estimator_busy: "},
	codeUnavailable:     {typ: "UNAVAILABLE/UNAVAILABLE"},
	codeUpstream:        {typ: "UNAVAILABLE/UPSTREAM_FAILED"},
	codeUnserved:        {typ: "NOT_FOUND/NOT_FOUND"},
	codeModelNotAllowed: {typ: "PERMISSION_DENIED/MODEL_NOT_ALLOWED", noRetry: true},
}

func (gemini) shape(c code) shape {
	return shapeIn(geminiShapes, c, shape{typ: "INVALID_ARGUMENT/INVALID_ARGUMENT"})
}

// geminiError is Google's error body, which the genai SDKs read into
// their APIError: code, message, status and details.
type geminiError struct {
	Error struct {
		Code    int              `json:"code"`
		Message string           `json:"message"`
		Status  string           `json:"status"`
		Details []map[string]any `json:"details"`
	} `json:"error"`
}

// geminiErrorDomain is the ErrorInfo's domain: the service that refused.
const geminiErrorDomain = "tokengate"

// writeError writes Google's error: a param leads the message and is the
// field of a google.rpc.BadRequest; a refusal that set Retry-After-Ms (the
// path's) carries it as a google.rpc.RetryInfo, as Google's own quota
// refusals do.
func (gemini) writeError(w http.ResponseWriter, status int, typ, param, message string) {
	grpcStatus, reason, _ := strings.Cut(typ, "/")
	if param != "" {
		message = param + ": " + message
	}
	var b geminiError
	b.Error.Code, b.Error.Message, b.Error.Status = status, message, grpcStatus
	b.Error.Details = []map[string]any{{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": reason, "domain": geminiErrorDomain}}
	if param != "" {
		b.Error.Details = append(b.Error.Details, map[string]any{"@type": "type.googleapis.com/google.rpc.BadRequest",
			"fieldViolations": []map[string]string{{"field": param, "description": message}}})
	}
	if ms, err := strconv.ParseInt(w.Header().Get("Retry-After-Ms"), 10, 64); err == nil && ms >= 0 {
		b.Error.Details = append(b.Error.Details, map[string]any{"@type": "type.googleapis.com/google.rpc.RetryInfo",
			"retryDelay": retryDelay(ms)})
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(b)
}

// retryDelay is ms as a google.protobuf.Duration's JSON: seconds with up
// to three decimals and an "s".
func retryDelay(ms int64) string {
	s := strconv.FormatInt(ms/1000, 10)
	if frac := ms % 1000; frac != 0 {
		s += "." + strings.TrimRight(strconv.FormatInt(1000+frac, 10)[1:], "0")
	}
	return s + "s"
}
