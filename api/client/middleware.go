package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// MiddlewareConfig configures Middleware. The zero value serves one tenant
// (Config.Key).
type MiddlewareConfig struct {
	// Key returns the tenant key of a request, for a frontend that serves
	// many tenants. Default: Config.Key.
	Key func(*http.Request) string
	// BodyLimit bounds the request body read to estimate it. Default 4 MiB
	// (413 above it).
	BodyLimit int64
	// EndTimeout bounds the settle or release after the handler returns,
	// which runs even if the client has gone. Default 10 s.
	EndTimeout time.Duration
	Logger     *slog.Logger
}

// Middleware admits each request before the handler runs and ends its
// admission after: settled with the usage the handler reported
// (ReportUsage), released if it reported none and answered an error (or
// panicked), else settled at the estimate. A request that is not admitted
// never reaches the handler: it gets tokengate's status and JSON error (429
// with Retry-After when a limit refused it; 503 when tokengate cannot be
// reached). No path leaves a reservation open.
func (c *Client) Middleware(cfg MiddlewareConfig) func(http.Handler) http.Handler {
	if cfg.BodyLimit <= 0 {
		cfg.BodyLimit = 4 << 20
	}
	if cfg.EndTimeout <= 0 {
		cfg.EndTimeout = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, cfg.BodyLimit))
			if err != nil {
				writeJSONError(w, &Error{Status: http.StatusRequestEntityTooLarge, Type: "body_too_large", Message: "the request body is too large to admit"})
				return
			}
			key := ""
			if cfg.Key != nil {
				key = cfg.Key(r)
			}
			a, err := c.Reserve(r.Context(), Request{Body: json.RawMessage(body), Key: key})
			if err != nil {
				var apiErr *Error
				if !errors.As(err, &apiErr) {
					apiErr = &Error{Status: http.StatusServiceUnavailable, Type: "admission_unavailable", Message: "tokengate could not be reached"}
					cfg.Logger.Error("admission failed", "error", err.Error())
				}
				writeJSONError(w, apiErr)
				return
			}
			rep := &reporter{admission: a}
			r = r.WithContext(context.WithValue(r.Context(), reporterKey{}, rep))
			r.Body = io.NopCloser(bytes.NewReader(body))
			r.ContentLength = int64(len(body))
			sw := &statusWriter{ResponseWriter: w}
			defer func() {
				p := recover()
				c.endAfter(context.WithoutCancel(r.Context()), cfg, rep, sw.status(), p != nil)
				if p != nil {
					panic(p)
				}
			}()
			next.ServeHTTP(sw, r)
		})
	}
}

// endAfter settles or releases the admission once the handler is done.
func (c *Client) endAfter(ctx context.Context, cfg MiddlewareConfig, rep *reporter, status int, panicked bool) {
	ctx, cancel := context.WithTimeout(ctx, cfg.EndTimeout)
	defer cancel()
	u, reported := rep.get()
	var err error
	switch {
	case reported:
		_, err = c.Settle(ctx, rep.admission, u)
	case panicked || status >= 400:
		_, err = c.Release(ctx, rep.admission)
	default:
		// It answered without saying what it used: the estimate stands.
		est := rep.admission.Estimate
		_, err = c.Settle(ctx, rep.admission, Usage{InputTokens: est.InputTokens, OutputTokens: est.OutputTokens})
	}
	if err != nil {
		cfg.Logger.Error("ending the admission failed; it expires at its TTL", "admission", rep.admission.ID, "error", err.Error())
	}
}

type reporterKey struct{}

// reporter carries a request's admission and the usage its handler
// reports.
type reporter struct {
	admission *Admission
	mu        sync.Mutex
	usage     *Usage
}

func (r *reporter) get() (Usage, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.usage == nil {
		return Usage{}, false
	}
	return *r.usage, true
}

// ReportUsage records what the request of ctx used, for Middleware to
// settle with once the handler returns. The last report wins. It returns
// false when ctx is not a request Middleware admitted.
func ReportUsage(ctx context.Context, u Usage) bool {
	rep, ok := ctx.Value(reporterKey{}).(*reporter)
	if !ok {
		return false
	}
	rep.mu.Lock()
	rep.usage = &u
	rep.mu.Unlock()
	return true
}

// AdmissionFrom returns the admission of a request Middleware admitted.
func AdmissionFrom(ctx context.Context) (*Admission, bool) {
	rep, ok := ctx.Value(reporterKey{}).(*reporter)
	if !ok {
		return nil, false
	}
	return rep.admission, true
}

// statusWriter records the handler's status. It passes Flush on (streams)
// and Unwrap lets http.ResponseController reach the writer beneath.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (s *statusWriter) WriteHeader(code int) {
	if s.code == 0 {
		s.code = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(b []byte) (int, error) {
	if s.code == 0 {
		s.code = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

func (s *statusWriter) Flush() {
	if s.code == 0 {
		s.code = http.StatusOK
	}
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// status is the handler's status; a handler that wrote nothing answered
// 200 (net/http sends it).
func (s *statusWriter) status() int {
	if s.code == 0 {
		return http.StatusOK
	}
	return s.code
}

func writeJSONError(w http.ResponseWriter, e *Error) {
	if e.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.FormatInt(int64((e.RetryAfter+time.Second-1)/time.Second), 10))
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.Status)
	var body struct {
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
			Field   string `json:"field,omitempty"`
			Limit   string `json:"limit,omitempty"`
		} `json:"error"`
	}
	body.Error.Type, body.Error.Message, body.Error.Field, body.Error.Limit = e.Type, e.Message, e.Field, e.Limit
	_ = json.NewEncoder(w).Encode(body)
}
