// Package client is the Go client of tokengate's admission API, for
// frontends that call tokengate themselves: Reserve before the model runs,
// then Settle with the usage the model reported, or Release if it never
// ran. Middleware does the three around a net/http handler.
//
// Every call is safe to retry, and the client retries it: Reserve sends an
// Idempotency-Key it makes up (the same on every attempt, so a retry after a
// lost answer gets the first admission, not a second debit), and settling or
// releasing twice answers the same. Retries are bounded, wait with jitter,
// and honour tokengate's Retry-After; no wait outlasts the caller's
// deadline.
//
// It imports nothing of tokengate's: a frontend vendors only this package.
package client

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	mathrand "math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Config configures a Client. BaseURL is required, and Key unless every
// call names its own.
type Config struct {
	// BaseURL is tokengate's address, e.g. http://tokengate:8080.
	BaseURL string
	// Key is the tenant's key (tg_...).
	Key string
	// HTTPClient makes the calls. Default: a client of its own, without an
	// overall timeout (AttemptTimeout bounds each attempt).
	HTTPClient *http.Client
	// MaxRetries bounds the retries of one call after its first attempt.
	// Default 3; negative means none.
	MaxRetries int
	// MaxBackoff bounds one wait between attempts. A refusal whose
	// Retry-After is longer is returned at once rather than waited for.
	// Default 5 s.
	MaxBackoff time.Duration
	// AttemptTimeout bounds one attempt, so a hung connection cannot spend
	// the whole deadline. Default 5 s.
	AttemptTimeout time.Duration
}

// Client calls tokengate. It is safe for concurrent use.
type Client struct {
	cfg  Config
	base *url.URL
}

// New returns a Client.
func New(cfg Config) (*Client, error) {
	base, err := url.Parse(strings.TrimRight(cfg.BaseURL, "/"))
	if err != nil || (base.Scheme != "http" && base.Scheme != "https") || base.Host == "" {
		return nil, fmt.Errorf("client: BaseURL %q: want an http(s) URL", cfg.BaseURL)
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{}
	}
	switch {
	case cfg.MaxRetries == 0:
		cfg.MaxRetries = 3
	case cfg.MaxRetries < 0:
		cfg.MaxRetries = 0
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = 5 * time.Second
	}
	if cfg.AttemptTimeout <= 0 {
		cfg.AttemptTimeout = 5 * time.Second
	}
	return &Client{cfg: cfg, base: base}, nil
}

// Request is one request to admit.
type Request struct {
	// Body is the OpenAI-style request (chat completions, completions or
	// responses) the model will run: []byte or json.RawMessage as it is,
	// anything else marshalled to JSON.
	Body any
	// IdempotencyKey makes the admission idempotent across the caller's own
	// retries too. Default: one made up per Reserve call.
	IdempotencyKey string
	// Key overrides Config.Key, for a frontend that serves many tenants.
	Key string
}

// Estimate is tokengate's estimate of a request.
type Estimate struct {
	InputTokens  int64 `json:"input_tokens"`
	OutputTokens int64 `json:"output_tokens"`
	Cost         int64 `json:"cost"`
	Approximate  bool  `json:"approximate"`
}

// Remaining is what the tenant has left after a call.
type Remaining struct {
	Tokens       int64  `json:"tokens"`
	Requests     *int64 `json:"requests"`
	PeriodBudget *int64 `json:"period_budget"`
}

// Admission is an admitted request: settle or release it by its ID.
type Admission struct {
	ID        string    `json:"id"`
	Model     string    `json:"model"`
	Estimate  Estimate  `json:"estimate"`
	CreatedAt time.Time `json:"created_at"`
	ExpiresAt time.Time `json:"expires_at"`
	Remaining Remaining `json:"remaining"`
	// Replayed says an earlier attempt (or call) under the same
	// idempotency key was admitted, and this is that admission.
	Replayed bool `json:"-"`
	// key is the tenant key it was admitted with, for Settle and Release.
	key string
}

// Usage is what a request used, as the provider reported it.
type Usage struct {
	InputTokens  int64
	OutputTokens int64
	// CachedInputTokens is the part of InputTokens served from the
	// provider's cache (counted at the model's cached-input weight).
	CachedInputTokens int64
	// ReasoningTokens is the part of OutputTokens the model spent
	// reasoning (OpenAI's reasoning_tokens): counted as output, and
	// carried for pricing in money.
	ReasoningTokens int64
}

// Ended is the answer to a settle or release.
type Ended struct {
	ID    string `json:"id"`
	State string `json:"state"` // settled, released, or pending (journaled while tokengate's store was down)
	Late  bool   `json:"late"`
	// Delta is the estimate's cost minus the actual cost: positive is a
	// refund.
	Delta     int64     `json:"delta"`
	Remaining Remaining `json:"remaining"`
	// Pending says tokengate journaled the call (its store was
	// unreachable) and applies it when the store is back.
	Pending bool `json:"-"`
}

// Error is tokengate's answer to a call it did not carry out.
type Error struct {
	Status  int
	Type    string `json:"type"`
	Message string `json:"message"`
	// Field names the offending field of a 400.
	Field string `json:"field"`
	// Limit names the limit that refused a 429 (tokens, requests,
	// concurrency, period_budget: BudgetExhausted).
	Limit string `json:"limit"`
	// RetryAfter is how long tokengate said to wait, if it said.
	RetryAfter time.Duration `json:"-"`
}

func (e *Error) Error() string {
	msg := fmt.Sprintf("tokengate: %d %s: %s", e.Status, e.Type, e.Message)
	if e.Field != "" {
		msg += " (" + e.Field + ")"
	}
	return msg
}

// Rejected says a limit refused the request (429): nothing was debited,
// and RetryAfter says when it may fit.
func (e *Error) Rejected() bool { return e.Status == http.StatusTooManyRequests }

// BudgetExhausted says a calendar window of the tenant's budget has no
// room left until it resets (429 budget_exhausted, its Limit
// period_budget): RetryAfter is the time to the reset, and the client
// does not retry it.
func (e *Error) BudgetExhausted() bool { return e.Type == "budget_exhausted" }

// retryable says whether another attempt may succeed: a refusal (the
// bucket refills), tokengate busy or unreachable, or a gateway in between
// failing. An exhausted budget is not retried: only its reset, hours
// away, can make room.
func (e *Error) retryable() bool {
	if e.BudgetExhausted() {
		return false
	}
	switch e.Status {
	case http.StatusTooManyRequests, http.StatusServiceUnavailable, http.StatusBadGateway, http.StatusGatewayTimeout, http.StatusInternalServerError:
		return true
	}
	return false
}

// Reserve estimates the request and reserves its cost from the tenant's
// budget. A refusal is an *Error with Rejected() true, returned once the
// retries are spent or its Retry-After is longer than the deadline or
// MaxBackoff allows.
func (c *Client) Reserve(ctx context.Context, req Request) (*Admission, error) {
	var body []byte
	switch b := req.Body.(type) {
	case []byte:
		body = b
	case json.RawMessage:
		body = b
	default:
		var err error
		if body, err = json.Marshal(b); err != nil {
			return nil, fmt.Errorf("client: marshal the request: %w", err)
		}
	}
	idem := req.IdempotencyKey
	if idem == "" {
		var b [16]byte
		_, _ = rand.Read(b[:])
		idem = "tgc-" + hex.EncodeToString(b[:])
	}
	key := c.key(req.Key)
	a := &Admission{key: key}
	hdr, err := c.call(ctx, key, "/v1/admissions", body, idem, a)
	if err != nil {
		return nil, err
	}
	a.Replayed = hdr.Get("Idempotent-Replayed") == "true"
	return a, nil
}

// Settle reconciles the admission with what the request used: the
// difference from the estimate is refunded (or charged).
func (c *Client) Settle(ctx context.Context, a *Admission, u Usage) (*Ended, error) {
	body, _ := json.Marshal(map[string]any{"usage": map[string]any{
		"prompt_tokens": u.InputTokens, "completion_tokens": u.OutputTokens,
		"prompt_tokens_details":     map[string]int64{"cached_tokens": u.CachedInputTokens},
		"completion_tokens_details": map[string]int64{"reasoning_tokens": u.ReasoningTokens},
	}})
	return c.end(ctx, a, "settle", body)
}

// Release refunds the whole estimate: the request never ran.
func (c *Client) Release(ctx context.Context, a *Admission) (*Ended, error) {
	return c.end(ctx, a, "release", nil)
}

func (c *Client) end(ctx context.Context, a *Admission, verb string, body []byte) (*Ended, error) {
	if a == nil || a.ID == "" {
		return nil, errors.New("client: no admission to " + verb)
	}
	e := &Ended{}
	if _, err := c.call(ctx, c.key(a.key), "/v1/admissions/"+url.PathEscape(a.ID)+"/"+verb, body, "", e); err != nil {
		return nil, err
	}
	e.Pending = e.State == "pending"
	return e, nil
}

func (c *Client) key(k string) string {
	if k != "" {
		return k
	}
	return c.cfg.Key
}

// call POSTs body to path, retrying as the package says, and decodes a
// success into out.
func (c *Client) call(ctx context.Context, key, path string, body []byte, idem string, out any) (http.Header, error) {
	var last error
	for attempt := 0; ; attempt++ {
		hdr, status, raw, err := c.attempt(ctx, key, path, body, idem)
		var wait time.Duration
		switch {
		case err == nil && status < 300:
			if err := json.Unmarshal(raw, out); err != nil {
				return nil, fmt.Errorf("client: decode the answer of %s: %w", path, err)
			}
			return hdr, nil
		case err == nil:
			apiErr := decodeError(status, hdr, raw)
			if !apiErr.retryable() {
				return nil, apiErr
			}
			last, wait = apiErr, apiErr.RetryAfter
		case ctx.Err() != nil:
			// The caller's deadline or cancellation, not tokengate's.
			if last != nil {
				return nil, fmt.Errorf("client: %w (after: %w)", ctx.Err(), last)
			}
			return nil, fmt.Errorf("client: %s: %w", path, ctx.Err())
		default:
			last = fmt.Errorf("client: %s: %w", path, err) // connection failed, or the attempt timed out
		}
		if attempt >= c.cfg.MaxRetries {
			return nil, last
		}
		if wait == 0 {
			// Exponential from 100 ms, full jitter: replicas of a frontend
			// that failed together do not retry together.
			wait = time.Duration(mathrand.Int64N(int64(100*time.Millisecond) << min(attempt, 10)))
		} else {
			// Never earlier than told; a little later, spread.
			wait += time.Duration(mathrand.Int64N(int64(wait)/10 + 1))
		}
		if wait > c.cfg.MaxBackoff {
			return nil, last
		}
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait {
			return nil, last // waiting would outlast the deadline: answer now
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("client: %w (after: %w)", ctx.Err(), last)
		case <-t.C:
		}
	}
}

func (c *Client) attempt(ctx context.Context, key, path string, body []byte, idem string) (http.Header, int, []byte, error) {
	actx, cancel := context.WithTimeout(ctx, c.cfg.AttemptTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(actx, http.MethodPost, c.base.String()+path, bytes.NewReader(body))
	if err != nil {
		return nil, 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	if idem != "" {
		req.Header.Set("Idempotency-Key", idem)
	}
	resp, err := c.cfg.HTTPClient.Do(req)
	if err != nil {
		return nil, 0, nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, 0, nil, err
	}
	return resp.Header, resp.StatusCode, raw, nil
}

// decodeError reads tokengate's error body; an answer that is not one
// (a proxy's page) keeps its status and a short excerpt.
func decodeError(status int, hdr http.Header, raw []byte) *Error {
	var v struct {
		Error *struct {
			Error
			RetryAfterMS *int64 `json:"retry_after_ms"`
		} `json:"error"`
	}
	e := &Error{Status: status}
	if json.Unmarshal(raw, &v) == nil && v.Error != nil {
		*e = v.Error.Error
		e.Status = status
		if v.Error.RetryAfterMS != nil {
			e.RetryAfter = time.Duration(*v.Error.RetryAfterMS) * time.Millisecond
		}
	} else {
		e.Type = http.StatusText(status)
		e.Message = strings.TrimSpace(string(raw[:min(len(raw), 200)]))
	}
	if e.RetryAfter == 0 {
		if s, err := strconv.ParseFloat(hdr.Get("Retry-After"), 64); err == nil && s > 0 && s < math.MaxInt32 {
			e.RetryAfter = time.Duration(s * float64(time.Second))
		}
	}
	return e
}
