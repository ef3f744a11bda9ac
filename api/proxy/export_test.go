package proxy

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/tokengate/tokengate/budget/replica"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

// NewWithToyWire is New serving the toy wire too, whose upstream is at
// base: a wire added with no change to the path (path.go).
func NewWithToyWire(rep *replica.Replica, cfg Config, base *url.URL) *Proxy {
	p := New(rep, cfg)
	p.wires = append(p.wires, toyWire{base: base})
	return p
}

// toyWire is a made-up wire shaped like Gemini's, so that the path is
// proven to serve one it was not written for: the model in the URL's path
// (/toy/{model}:say and :count), the key in X-Toy-Key or ?key= (never
// forwarded), a body {"text": ..., "limit": N}, usage in {"meter": {"in":
// N, "out": N, "cached": N}}, streams of {"said": ...} events that end
// with a meter, and errors as {"toy_error": {"kind": ..., "words": ...}}
// with X-Toy-Left headers.
type toyWire struct{ base *url.URL }

func (toyWire) route(r *http.Request) (route, bool) {
	rest, ok := strings.CutPrefix(r.URL.Path, "/toy/")
	if !ok {
		return route{}, false
	}
	switch {
	case strings.HasSuffix(rest, ":say"):
		return route{op: "chat"}, true
	case strings.HasSuffix(rest, ":count"):
		return route{op: "chat", count: true}, true
	}
	return route{}, false
}

func (t toyWire) upstream(*Config) *url.URL { return t.base }

func (toyWire) provider() string { return "toy" }

func (toyWire) key(r *http.Request) string {
	if k := r.Header.Get("X-Toy-Key"); k != "" {
		return k
	}
	return r.URL.Query().Get("key")
}

// parse reads the model from the path and states the call to the
// estimator in OpenAI's words.
func (toyWire) parse(_ route, r *http.Request, body []byte) (*estimator.Request, error) {
	var v struct {
		Text  string `json:"text"`
		Limit int64  `json:"limit"`
	}
	if err := json.Unmarshal(body, &v); err != nil {
		return nil, &estimator.InvalidError{Field: "body", Reason: "must be a JSON object"}
	}
	model, _, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/toy/"), ":")
	chat, _ := json.Marshal(map[string]any{"model": model, "max_tokens": v.Limit,
		"messages": []map[string]string{{"role": "user", "content": v.Text}}})
	return estimator.Parse(chat)
}

func (toyWire) prepare(_ *route, body []byte) ([]byte, error) { return body, nil }

func (toyWire) count(_ *Proxy, w http.ResponseWriter, _ *http.Request, _ []byte, est estimator.Estimate) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write([]byte(`{"tokens":` + strconv.FormatInt(est.InputTokens, 10) + `}`))
}

// request forwards to the same path, without the tenant's key.
func (t toyWire) request(ctx context.Context, _ *Config, r *http.Request, body []byte) (*http.Request, error) {
	q := r.URL.Query()
	q.Del("key")
	target := t.base.JoinPath(r.URL.Path)
	target.RawQuery = q.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target.String(), strings.NewReader(string(body)))
	if err == nil {
		req.Header.Set("X-Toy-Key", "toy-upstream")
	}
	return req, err
}

func (toyWire) answered(h http.Header) { h.Del("X-Toy-Org-Left") }

type toyMeter struct {
	Meter *struct{ In, Out, Cached int64 } `json:"meter"`
	Said  string                           `json:"said"`
}

func (m toyMeter) usage() rule.Usage {
	return rule.Usage{Input: m.Meter.In, Output: m.Meter.Out, CacheRead: m.Meter.Cached}
}

func (toyWire) usage(_ route, body []byte) (rule.Usage, bool) {
	var m toyMeter
	if json.Unmarshal(body, &m) != nil || m.Meter == nil {
		return rule.Usage{}, false
	}
	return m.usage(), true
}

type toyStream struct {
	est  estimator.Estimate
	said int64 // words said so far
	got  *rule.Usage
}

func (toyWire) framing(_ route, h http.Header) framing { return sseFraming(h) }

func (toyWire) stream(_ route, est estimator.Estimate, _ outputCounter) streamReader {
	return &toyStream{est: est}
}

func (s *toyStream) event(data []byte) (forward, final bool) {
	var m toyMeter
	if json.Unmarshal(data, &m) != nil {
		return true, false
	}
	s.said += int64(len(strings.Fields(m.Said)))
	if m.Meter != nil {
		u := m.usage()
		s.got = &u
		return true, true
	}
	return true, false
}

func (s *toyStream) usage() rule.Usage {
	if s.got != nil {
		return *s.got
	}
	return rule.Usage{Input: s.est.InputTokens, Output: s.said}
}

func (s *toyStream) silent() bool { return false }

func (toyWire) shape(c code) shape {
	switch c {
	case codeRejected, codeExhausted:
		return shape{status: http.StatusTooManyRequests, typ: "slow_down"}
	case codeBadKey:
		return shape{status: http.StatusUnauthorized, typ: "who_are_you"}
	case codeInvalid, codeKeyMismatch, codeReplayed:
		return shape{status: http.StatusBadRequest, typ: "bad_toy"}
	}
	return shape{status: http.StatusInternalServerError, typ: "broken_toy"}
}

func (toyWire) writeError(w http.ResponseWriter, status int, typ, param, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"toy_error": map[string]string{"kind": typ, "field": param, "words": message}})
}

func (toyWire) rateHeaders(h http.Header, snap rule.Snapshot) {
	h.Set("X-Toy-Left", strconv.FormatInt(snap.Tokens(), 10))
}

func (toyWire) exhaustedHeaders(http.Header, *rule.BudgetExhaustedError) {}
