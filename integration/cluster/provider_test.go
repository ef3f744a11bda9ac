//go:build cluster && soak

package cluster_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"path"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// provider emulates an OpenAI provider, and a Gemini one
// (provider_gemini_test.go), behind the replicas' proxies: it answers each
// chat completion as the soak client that sent it planned
// (the plan is found by the call's "user" field, which the proxy forwards
// untouched), and records what it answered, which is what the proxy must
// settle from. It runs in this process; the replicas reach it through their
// network's gateway, as they reach the Postgres proxies.
type provider struct {
	srv  *http.Server
	addr string // host:port, as the replicas reach it

	mu       sync.Mutex
	plans    map[string]providerPlan
	answered map[string][]providerAnswer // by call id
	// strays are the calls it got that it must not have: the checker
	// reports each (provider_gemini_test.go).
	strays []string
}

// providerPlan is how the upstream is to answer one call.
type providerPlan struct {
	fail    bool          // 500 before any output: the proxy releases
	usage   bool          // report usage; else the proxy settles at its estimate
	in, out int64         // the usage reported
	delay   time.Duration // before the answer (a model at work)
	gemini  *geminiPlan   // a Gemini call's usageMetadata (provider_gemini_test.go)
}

// providerAnswer is what the upstream answered one call.
type providerAnswer struct {
	status     int
	stream     bool
	askedUsage bool // stream_options.include_usage, as the proxy forwarded it
	reported   bool // the answer carried usage
	in, out    int64
	// A Gemini call's: its form (formGenerate, formSSE, formArray), the
	// candidates it asked for, and the usage it stated and how it ended.
	gemini     bool
	form       string
	candidates int
	g          geminiPlan
}

func newProvider(t *testing.T, c *cluster) *provider {
	ln, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	u := &provider{addr: net.JoinHostPort(c.gateway(), port), plans: map[string]providerPlan{}, answered: map[string][]providerAnswer{}}
	u.srv = &http.Server{Handler: u, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = u.srv.Serve(ln) }()
	t.Cleanup(func() { _ = u.srv.Close() })
	return u
}

// plan registers how the call named id is to be answered.
func (u *provider) plan(id string, p providerPlan) {
	u.mu.Lock()
	u.plans[id] = p
	u.mu.Unlock()
}

// answers returns what the upstream answered the call named id, once per
// time it was called.
func (u *provider) answers(id string) []providerAnswer {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.answered[id]
}

// stray returns the calls the upstream got that it must not have.
func (u *provider) stray() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.strays)
}

func (u *provider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.Contains(path.Base(r.URL.Path), ":") { // models/{model}:{method}
		u.serveGemini(w, r)
		return
	}
	raw, _ := io.ReadAll(r.Body)
	var body struct {
		User          string `json:"user"`
		Stream        bool   `json:"stream"`
		StreamOptions struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	_ = json.Unmarshal(raw, &body)
	u.mu.Lock()
	p, ok := u.plans[body.User]
	u.mu.Unlock()
	a := providerAnswer{status: http.StatusOK, stream: body.Stream, askedUsage: body.StreamOptions.IncludeUsage}
	switch {
	case r.URL.Path != "/v1/chat/completions" || !ok:
		a.status = http.StatusBadRequest
	case p.fail:
		a.status = http.StatusInternalServerError
	default:
		// A stream carries its usage only if asked for it, as OpenAI's.
		a.reported = p.usage && (!body.Stream || a.askedUsage)
		if a.reported {
			a.in, a.out = p.in, p.out
		}
	}
	u.mu.Lock()
	u.answered[body.User] = append(u.answered[body.User], a)
	u.mu.Unlock()
	time.Sleep(p.delay) // real time: the provider's latency, as a real upstream's, keeps calls in flight
	if a.status != http.StatusOK {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(a.status)
		fmt.Fprint(w, `{"error":{"message":"the soak's upstream failed this call","type":"server_error","param":null,"code":null}}`)
		return
	}
	usage := ""
	if a.reported {
		usage = fmt.Sprintf(`{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}`, a.in, a.out, a.in+a.out)
	}
	if !body.Stream {
		if usage != "" {
			usage = `,"usage":` + usage
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"soak","object":"chat.completion","created":1,"model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]%s}`, usage)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	events := []string{
		`{"id":"soak","object":"chat.completion.chunk","created":1,"model":"gpt-4o-mini","choices":[{"index":0,"delta":{"content":"o"},"finish_reason":null}]}`,
		`{"id":"soak","object":"chat.completion.chunk","created":1,"model":"gpt-4o-mini","choices":[{"index":0,"delta":{"content":"k"},"finish_reason":"stop"}]}`,
	}
	if usage != "" {
		events = append(events, `{"id":"soak","object":"chat.completion.chunk","created":1,"model":"gpt-4o-mini","choices":[],"usage":`+usage+`}`)
	}
	for _, e := range append(events, "[DONE]") {
		fmt.Fprintf(w, "data: %s\n\n", e)
		w.(http.Flusher).Flush()
	}
}
