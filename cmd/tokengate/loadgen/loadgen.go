package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// Config says what load to generate, and through which face: the HTTP API
// (URL or URLs, with Keys) or, when RLS is set, the rate limit service
// over gRPC (with Gateway and Tenants).
type Config struct {
	URL         string        // base URL, e.g. http://localhost:8080
	URLs        []string      // several replicas: workers take them round-robin (URL is then ignored)
	Keys        []string      // tenant keys; workers take them round-robin
	Concurrency int           // workers, each with one request in flight
	Duration    time.Duration // how long to run
	Rate        float64       // total admissions per second; 0 = as fast as possible
	Model       string
	MaxTokens   int
	Settle      bool // settle each admission with usage below the estimate
	// IdempotencyKeys sends each HTTP admission with an Idempotency-Key of
	// its own, as a client does that retries safely (and as a gateway's
	// request id always keys its reservation in the rate limit service):
	// the store then also records and checks the key.
	IdempotencyKeys bool
	// Client, when set, is the net/http client the HTTP mode calls
	// through; otherwise each worker calls through fasthttp.
	Client *http.Client

	// RLS drives the rate limit service (envoy.service.ratelimit.v3) at
	// these addresses instead of the HTTP API: workers take them
	// round-robin, each over its own pool of RLSConns connections.
	RLS      []string
	RLSConns int      // gRPC connections per address; default 1 (HTTP/2 multiplexes the calls)
	Gateway  string   // the gateway credential (tgw_...), sent as "authorization: Bearer ..."
	Tenants  []string // tenants the calls name; workers take them round-robin
	// Hits is each call's cost (hits_addend); default PromptTokens +
	// MaxTokens, what the HTTP API estimates for the HTTP mode's request.
	Hits int64
	// Descriptors is the shape of the calls' descriptor: tokengate's
	// (the default) or a generic rate limit service's (DescriptorsTenant).
	Descriptors Descriptors
}

// Descriptors names the descriptor the rate limit mode sends.
type Descriptors string

const (
	// DescriptorsTokengate is tokengate's descriptor: tenant, model,
	// request_id and phase, with a gateway credential. The default.
	DescriptorsTokengate Descriptors = "tokengate"
	// DescriptorsTenant is one entry, tenant=NAME, as a generic rate limit
	// service such as envoyproxy/ratelimit counts it (a limit per tenant
	// value): the admit's hits are the cost and the stream end's, the same
	// descriptor again, the usage, as Envoy AI Gateway charges tokens. It
	// needs no gateway credential.
	DescriptorsTenant Descriptors = "tenant"
)

// PromptTokens is what tokengate counts in the prompt of the HTTP mode's
// request (gpt-4o-mini's tokenizer: 31): the RLS mode's default cost is
// PromptTokens + MaxTokens, the HTTP mode's estimate for the same request.
const PromptTokens = 31

// usage is the usage both modes settle with: the prompt as the model
// counted it and a third of the allowed output, below the estimate.
func usage(maxTokens int) (prompt, completion int64) { return 30, int64(maxTokens / 3) }

// Report is what the load saw.
type Report struct {
	Duration        time.Duration  `json:"duration_ns"`
	Requests        int            `json:"requests"`
	Admitted        int            `json:"admitted"`
	Rejected        map[string]int `json:"rejected"` // by limit
	Errors          int            `json:"errors"`
	Settled         int            `json:"settled"`
	AdmitLatency    Percentiles    `json:"admit_latency"`
	SettleLatency   Percentiles    `json:"settle_latency"`
	AdmitsPerSecond float64        `json:"admits_per_second"`
}

// Percentiles of a latency distribution.
type Percentiles struct {
	P50 time.Duration `json:"p50_ns"`
	P90 time.Duration `json:"p90_ns"`
	P99 time.Duration `json:"p99_ns"`
	Max time.Duration `json:"max_ns"`
}

func percentiles(d []time.Duration) Percentiles {
	if len(d) == 0 {
		return Percentiles{}
	}
	slices.Sort(d)
	at := func(q float64) time.Duration { return d[min(len(d)-1, int(q*float64(len(d))))] }
	return Percentiles{P50: at(0.50), P90: at(0.90), P99: at(0.99), Max: d[len(d)-1]}
}

func (r Report) String() string {
	var limits []string
	for l, n := range r.Rejected {
		limits = append(limits, fmt.Sprintf("%s=%d", l, n))
	}
	sort.Strings(limits)
	return fmt.Sprintf("%d requests in %s: %d admitted (%.0f/s), rejected %v, %d settled, %d errors\n"+
		"admit  latency p50 %s p90 %s p99 %s max %s\nsettle latency p50 %s p90 %s p99 %s max %s",
		r.Requests, r.Duration.Round(time.Millisecond), r.Admitted, r.AdmitsPerSecond, limits, r.Settled, r.Errors,
		r.AdmitLatency.P50, r.AdmitLatency.P90, r.AdmitLatency.P99, r.AdmitLatency.Max,
		r.SettleLatency.P50, r.SettleLatency.P90, r.SettleLatency.P99, r.SettleLatency.Max)
}

// outcome is how a face answered an admission.
type outcome int

const (
	admitted outcome = iota
	refused          // by a limit: sample.limit names it
	failed           // an answer that is neither (an HTTP 5xx, a gRPC error)
)

type sample struct {
	admit, settle  time.Duration
	outcome        outcome
	limit          string
	settled, error bool // error: no answer at all (not counted as a request)
}

// callFunc does one request the way a gateway does: admit, then settle
// when asked.
type callFunc func(ctx context.Context) sample

// Run generates load until cfg.Duration passes or ctx ends.
func Run(ctx context.Context, cfg Config) (Report, error) {
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 16
	}
	if cfg.Model == "" {
		cfg.Model = "gpt-4o-mini"
	}
	if cfg.MaxTokens <= 0 {
		cfg.MaxTokens = 100
	}
	var workers []callFunc
	if len(cfg.RLS) > 0 {
		conns, err := dialRLS(cfg)
		if err != nil {
			return Report{}, err
		}
		defer conns.close()
		workers = conns.workers(cfg)
	} else {
		var err error
		if workers, err = httpWorkers(cfg); err != nil {
			return Report{}, err
		}
	}
	return drive(ctx, cfg, workers), nil
}

// drive runs one goroutine per worker, at cfg.Rate in all, and reports.
func drive(ctx context.Context, cfg Config, workers []callFunc) Report {
	// The duration ends the starting of requests, not the requests in
	// flight: a request cut off mid-way may still have been admitted, and
	// the report must agree with the ledger.
	stop, cancel := context.WithTimeout(ctx, cfg.Duration)
	defer cancel()

	var tick <-chan time.Time
	if cfg.Rate > 0 {
		t := time.NewTicker(time.Duration(float64(time.Second) / cfg.Rate))
		defer t.Stop()
		tick = t.C
	}

	samples := make(chan sample, 4096)
	var wg sync.WaitGroup
	start := time.Now()
	for _, call := range workers {
		wg.Go(func() {
			for stop.Err() == nil {
				if tick != nil {
					select {
					case <-stop.Done():
						return
					case <-tick:
					}
				}
				samples <- call(ctx)
			}
		})
	}
	go func() { wg.Wait(); close(samples) }()

	r := Report{Rejected: map[string]int{}}
	var admits, settles []time.Duration
	for s := range samples {
		if s.error {
			if ctx.Err() == nil {
				r.Errors++
			}
			continue
		}
		r.Requests++
		admits = append(admits, s.admit)
		switch s.outcome {
		case admitted:
			r.Admitted++
		case refused:
			r.Rejected[s.limit]++
		default:
			r.Errors++
		}
		if s.settled {
			r.Settled++
			settles = append(settles, s.settle)
		}
	}
	r.Duration = time.Since(start)
	r.AdmitLatency, r.SettleLatency = percentiles(admits), percentiles(settles)
	r.AdmitsPerSecond = float64(r.Admitted) / r.Duration.Seconds()
	return r
}

// httpWorkers are cfg.Concurrency callers of the HTTP API, each with a
// connection of its own, kept alive. They speak through fasthttp's client
// unless cfg.Client is set: the load generator shares the machine's cores
// with the server and its Postgres, as pgbench does with the Postgres it
// measures, and through net/http it spent 53-60 us of those cores per
// admission (two goroutines per connection, a header map and a body
// buffer per request), through fasthttp 35-38. A lean client leaves the
// cores to what is measured (BENCHMARKS.md, "eighth step").
func httpWorkers(cfg Config) ([]callFunc, error) {
	urls := cfg.URLs
	if len(urls) == 0 && cfg.URL != "" {
		urls = []string{cfg.URL}
	}
	if len(urls) == 0 || len(cfg.Keys) == 0 {
		return nil, fmt.Errorf("loadgen: a URL and at least one key are required")
	}
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Summarise the admission contract of tokengate in two sentences."}],"max_tokens":%d}`, cfg.Model, cfg.MaxTokens)
	prompt, completion := usage(cfg.MaxTokens)
	settleBody := fmt.Sprintf(`{"usage":{"prompt_tokens":%d,"completion_tokens":%d}}`, prompt, completion)
	run := nonce()
	var seq atomic.Uint64
	idemOf := func() string {
		if !cfg.IdempotencyKeys {
			return ""
		}
		return run + "-" + strconv.FormatUint(seq.Add(1), 36)
	}
	workers := make([]callFunc, cfg.Concurrency)
	if cfg.Client != nil {
		for w := range workers {
			key, url := cfg.Keys[w%len(cfg.Keys)], urls[w%len(urls)]
			workers[w] = func(ctx context.Context) sample {
				return one(ctx, netPoster{cfg.Client}, url, key, idemOf(), body, settleBody, cfg.Settle)
			}
		}
		return workers, nil
	}
	client := &fasthttp.Client{
		MaxConnsPerHost:          cfg.Concurrency,
		MaxIdleConnDuration:      time.Minute,
		ReadTimeout:              30 * time.Second,
		WriteTimeout:             30 * time.Second,
		NoDefaultUserAgentHeader: true,
	}
	for w := range workers {
		key, url := cfg.Keys[w%len(cfg.Keys)], urls[w%len(urls)]
		p := &fastPoster{client: client, auth: "Bearer " + strings.TrimSpace(key)}
		workers[w] = func(ctx context.Context) sample {
			return one(ctx, p, url, key, idemOf(), body, settleBody, cfg.Settle)
		}
	}
	return workers, nil
}

// poster sends one POST and returns its status and body; the body is
// valid until the next call.
type poster interface {
	post(ctx context.Context, url, key, idem, body string) (int, []byte, error)
}

func one(ctx context.Context, p poster, url, key, idem, body, settleBody string, settle bool) sample {
	var s sample
	t0 := time.Now()
	status, resp, err := p.post(ctx, url+"/v1/admissions", key, idem, body)
	s.admit = time.Since(t0)
	if err != nil {
		return sample{error: true}
	}
	var parsed struct {
		ID    string `json:"id"`
		Error struct {
			Limit string `json:"limit"`
		} `json:"error"`
	}
	_ = json.Unmarshal(resp, &parsed)
	switch status {
	case http.StatusCreated:
		s.outcome = admitted
	case http.StatusTooManyRequests:
		s.outcome, s.limit = refused, parsed.Error.Limit
	default:
		s.outcome = failed
	}
	if status == http.StatusCreated && settle {
		t1 := time.Now()
		code, _, err := p.post(ctx, url+"/v1/admissions/"+parsed.ID+"/settle", key, "", settleBody)
		s.settle = time.Since(t1)
		s.settled = err == nil && code == http.StatusOK
	}
	return s
}

// fastPoster is one worker's fasthttp request and response, reused.
type fastPoster struct {
	client *fasthttp.Client
	auth   string
	req    fasthttp.Request
	resp   fasthttp.Response
}

func (p *fastPoster) post(ctx context.Context, url, _, idem, body string) (int, []byte, error) {
	if err := ctx.Err(); err != nil {
		return 0, nil, err
	}
	p.req.Reset()
	p.req.SetRequestURI(url)
	p.req.Header.SetMethod(http.MethodPost)
	p.req.Header.Set("Authorization", p.auth)
	p.req.Header.SetContentType("application/json")
	if idem != "" {
		p.req.Header.Set("Idempotency-Key", idem)
	}
	p.req.SetBodyString(body)
	deadline := time.Now().Add(30 * time.Second)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	if err := p.client.DoDeadline(&p.req, &p.resp, deadline); err != nil {
		return 0, nil, err
	}
	return p.resp.StatusCode(), p.resp.Body(), nil
}

// netPoster posts through a net/http client (Config.Client).
type netPoster struct{ client *http.Client }

func (p netPoster) post(ctx context.Context, url, key, idem, body string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewBufferString(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(key))
	req.Header.Set("Content-Type", "application/json")
	if idem != "" {
		req.Header.Set("Idempotency-Key", idem)
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}
