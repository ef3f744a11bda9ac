package proxy_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokengate/tokengate/api/proxy"
	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/budget/replica"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
	"github.com/tokengate/tokengate/integration/pgtest"
	"github.com/tokengate/tokengate/ledger"
)

// TestToyWireNeedsNoPathChange: a wire the path was not written for (the
// toy wire of export_test.go, shaped like Gemini's: the model in the URL,
// the key in a header of its own or ?key=, its own usage, stream and error
// shapes) is served end to end by adding its dialect alone: admitted
// against the real store, forwarded without the tenant's key, settled from
// its usage whole and streamed, refused in its own shape, and counted
// without debit.
func TestToyWireNeedsNoPathChange(t *testing.T) {
	t.Parallel()
	pool := pgtest.New(t, nil)
	store := account.NewStore(pool)
	if _, err := store.CreateTenant(ctx, account.CreateTenantParams{ID: "acme", Limits: rule.Limits{TokensCapacity: 100_000, TokensRateMicro: rule.Micro}}); err != nil {
		t.Fatal(err)
	}
	_, key, err := credential.KeyCreate(ctx, pool, "acme")
	if err != nil {
		t.Fatal(err)
	}
	est := estimator.New(nil)
	table, err := estimator.DefaultTable().With([]estimator.Model{{Name: "gpt-4o", Encoding: estimator.EncodingO200K,
		InputWeightMicro: estimator.WeightOne, OutputWeightMicro: estimator.WeightOne, CachedInputWeightMicro: estimator.WeightOne / 2,
		DefaultOutputTokens: 16384, ContextWindow: 128000, PartTokens: 765}})
	if err != nil {
		t.Fatal(err)
	}
	est.SetTable(table)
	var mu sync.Mutex
	var seen []*http.Request
	answer := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Toy-Org-Left", "42")
		if r.URL.Query().Get("stream") == "1" {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: {\"said\":\"one two three\"}\n\ndata: {\"meter\":{\"in\":10,\"out\":3}}\n\n")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"said":"hello","meter":{"in":12,"out":7,"cached":4}}`)
	}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Clone(r.Context()))
		mu.Unlock()
		answer(w, r)
	}))
	t.Cleanup(up.Close)
	upURL, _ := url.Parse(up.URL)
	rep, err := replica.New(replica.Config{DB: pool, Store: store, Estimator: est, Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rep.Close)
	srv := httptest.NewServer(proxy.NewWithToyWire(rep, proxy.Config{}, upURL))
	t.Cleanup(srv.Close)

	call := func(path, body string, headers ...string) (int, http.Header, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(body))
		for i := 0; i+1 < len(headers); i += 2 {
			req.Header.Set(headers[i], headers[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, string(raw)
	}
	settled := func() *account.Admission {
		t.Helper()
		as, err := store.AdmissionRecent(ctx, "acme", 1)
		if err != nil || len(as) != 1 || as[0].State != account.StateSettled {
			t.Fatalf("last admission: %+v, %v; want one settled", as, err)
		}
		return as[0]
	}

	// A whole answer: the key in ?key=, never forwarded; settled from the
	// toy's meter, its 4 cached tokens at half weight (8 + 2 = 10).
	status, h, body := call("/toy/gpt-4o:say?key="+url.QueryEscape(key), `{"text":"hello there","limit":50}`)
	if status != http.StatusOK || h.Get("X-Tokengate-Admission") == "" || h.Get("X-Toy-Left") == "" || h.Get("X-Toy-Org-Left") != "" ||
		!strings.Contains(body, `"said":"hello"`) {
		t.Fatalf("say: %d %v %s", status, h, body)
	}
	mu.Lock()
	last := seen[len(seen)-1]
	mu.Unlock()
	if last.URL.Query().Has("key") || last.Header.Get("X-Toy-Key") != "toy-upstream" || last.URL.Path != "/toy/gpt-4o:say" {
		t.Fatalf("upstream saw %s with key %q", last.URL, last.Header.Get("X-Toy-Key"))
	}
	if a := settled(); *a.ActualInput != 10 || *a.ActualOutput != 7 {
		t.Fatalf("settled %d in, %d out; want 10, 7", *a.ActualInput, *a.ActualOutput)
	}

	// A stream, the key in the wire's header: settled at its final meter.
	status, _, body = call("/toy/gpt-4o:say?stream=1", `{"text":"hello there","limit":50}`, "X-Toy-Key", key)
	if status != http.StatusOK || !strings.Contains(body, `"said":"one two three"`) {
		t.Fatalf("stream: %d %s", status, body)
	}
	if a := settled(); *a.ActualInput != 10 || *a.ActualOutput != 3 {
		t.Fatalf("stream settled %d in, %d out; want 10, 3", *a.ActualInput, *a.ActualOutput)
	}

	// Refusals in the toy's own shape.
	var e struct {
		Err struct{ Kind, Field, Words string } `json:"toy_error"`
	}
	status, _, body = call("/toy/gpt-4o:say", `{"text":"hi","limit":5}`, "X-Toy-Key", "tg_wrong")
	if json.Unmarshal([]byte(body), &e) != nil || status != http.StatusUnauthorized || e.Err.Kind != "who_are_you" {
		t.Fatalf("bad key: %d %s", status, body)
	}
	status, _, body = call("/toy/gpt-4o:say", `not json`, "X-Toy-Key", key)
	if json.Unmarshal([]byte(body), &e) != nil || status != http.StatusBadRequest || e.Err.Kind != "bad_toy" || e.Err.Field != "body" {
		t.Fatalf("bad body: %d %s", status, body)
	}

	// A count: the estimate's input, and no admission.
	before, err := store.AdmissionRecent(ctx, "acme", 100)
	if err != nil {
		t.Fatal(err)
	}
	status, _, body = call("/toy/gpt-4o:count", `{"text":"hello there","limit":50}`, "X-Toy-Key", key)
	if status != http.StatusOK || !strings.HasPrefix(body, `{"tokens":`) {
		t.Fatalf("count: %d %s", status, body)
	}
	after, err := store.AdmissionRecent(ctx, "acme", 100)
	if err != nil || len(after) != len(before) {
		t.Fatalf("a count admitted: %d admissions, then %d (%v)", len(before), len(after), err)
	}

	if _, err := ledger.Verify(ctx, pool, "acme"); err != nil {
		t.Fatal(err)
	}
}
