package proxy_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/ledger"
)

// proxyRoutes are the OpenAI routes the proxy accepts, with seeds.
var proxyRoutes = []struct {
	path  string
	seeds []string
}{
	{"/v1/chat/completions", []string{`{"model":"gpt-4o","max_tokens":50,"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"gpt-4o","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"data:x"}}]}]}`,
		`{"model":"gpt-4o","max_completion_tokens":-5,"messages":[]}`}},
	{"/v1/completions", []string{`{"model":"gpt-4o","prompt":"hello","max_tokens":20}`, `{"model":"gpt-4o","prompt":["a","b"],"max_tokens":1e300}`}},
	{"/v1/responses", []string{`{"model":"gpt-4o","input":"hi","max_output_tokens":30}`, `{"model":"gpt-4o","input":[{"role":"user","content":"x"}],"instructions":7}`}},
	{"/v1/embeddings", []string{`{"model":"text-embedding-3-small","input":"hello","dimensions":8,"encoding_format":"base64","user":"u"}`,
		`{"model":"text-embedding-3-large","input":["a","b c"]}`, `{"model":"text-embedding-ada-002","input":[1,2,3]}`,
		`{"model":"text-embedding-3-small","input":[[1,2],[3]]}`, `{"model":"text-embedding-3-small","input":[[],""],"dimensions":-1}`,
		`{"model":"text-embedding-3-small","input":[9223372036854775808,1e300]}`, `{"model":"text-embedding-3-small","input":"hi","stream":true}`}},
	{"/v1/messages", []string{`{"model":"claude-sonnet-4-5","max_tokens":50,"system":"be brief","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"claude-opus-5-5","max_tokens":100,"stream":true,"thinking":{"type":"enabled","budget_tokens":2048},"tools":[{"name":"w","input_schema":{"type":"object"}}],` +
			`"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo="}},` +
			`{"type":"image","source":{"type":"url","url":"https://x/y.png"}},{"type":"document","source":{"type":"text","data":"d"}}]},` +
			`{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"w","input":{}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"ok"}]}]}`,
		`{"model":"claude-haiku-4-5","max_tokens":0,"messages":[]}`,
		`{"model":"claude-haiku-4-5","max_tokens":9223372036854775808,"messages":[{"role":"user","content":"hi"}]}`}},
	{"/v1/messages/count_tokens", []string{`{"model":"claude-sonnet-4-5","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"claude-sonnet-4-5","system":[{"type":"text","text":"x"}],"messages":[{"role":"user","content":[{"type":"thinking","thinking":"t"}]}]}`}},
}

// FuzzProxyBodies sends arbitrary bodies to the OpenAI-compatible proxy,
// in front of an upstream that answers every call with usage. Whatever the
// body: never a 5xx (the upstream never fails here), every 4xx is an
// OpenAI error object (Anthropic's, on the Messages routes), a refused
// call moves no balance, writes no ledger row and never reaches the
// upstream, and count_tokens never does either, whatever it answers.
func FuzzProxyBodies(f *testing.F) {
	for i, r := range proxyRoutes {
		for _, s := range r.seeds {
			f.Add(uint8(i), s)
		}
	}
	// NUL bytes (refused in the model, which is stored; kept in content,
	// which is only counted) and data after the JSON value.
	f.Add(uint8(0), `{"model":"gpt-4o\u0000","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`)
	f.Add(uint8(0), `{"model":"gpt-4o","max_tokens":5,"messages":[{"role":"user","content":"a\u0000b"}]}`)
	f.Add(uint8(0), "{\"model\":\"gpt-4o\",\"messages\":[]}\x00")
	f.Add(uint8(0), `{"model":"gpt-4o","max_tokens":5,"messages":[{"role":"user","content":"hi"}]} {"model":"gpt-4o"}`)
	f.Add(uint8(1), `{"model":"gpt-4o","prompt":"hello","max_tokens":20}trailing`)
	f.Add(uint8(2), `{"model":"\u0000","input":"hi"}`)
	// Huge and negative integers where money is computed (issue 21).
	f.Add(uint8(0), `{"model":"gpt-4o","max_tokens":1000000000,"messages":[{"role":"user","content":"hi"}]}`)
	f.Add(uint8(0), `{"model":"gpt-4o","max_tokens":9223372036854775808,"n":9223372036854775807,"messages":[{"role":"user","content":"hi"}]}`)
	f.Add(uint8(0), `{"model":"gpt-4o","max_completion_tokens":1e30,"messages":[{"role":"user","content":"hi"}]}`)
	f.Add(uint8(1), `{"model":"gpt-4o","prompt":["a","b","c"],"n":1000000000,"max_tokens":-9223372036854775808}`)
	f.Add(uint8(2), `{"model":"unknown-heavy","input":"hi","max_output_tokens":1000000000}`)
	b := setup(f, rule.Limits{TokensCapacity: 1_000_000_000, TokensRateMicro: rule.Micro})
	var calls int
	b.up.behave = func(w http.ResponseWriter, r *http.Request, body map[string]any) {
		calls++
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/v1/responses":
			fmt.Fprint(w, `{"id":"r1","object":"response","model":"gpt-4o","output":[],"usage":{"input_tokens":5,"output_tokens":3,"total_tokens":8}}`)
		case "/v1/embeddings":
			fmt.Fprint(w, `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.1]}],"model":"text-embedding-3-small","usage":{"prompt_tokens":5,"total_tokens":5}}`)
		case "/v1/messages":
			fmt.Fprint(w, `{"id":"m1","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[{"type":"text","text":"ok"}],"usage":{"input_tokens":5,"cache_creation_input_tokens":2,"cache_read_input_tokens":3,"output_tokens":3}}`)
		case "/v1/completions":
			fmt.Fprint(w, `{"id":"c1","object":"text_completion","model":"gpt-4o","choices":[{"text":"ok","index":0}],"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}}`)
		default:
			fmt.Fprint(w, `{"id":"c1","object":"chat.completion","model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}],"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}}`)
		}
	}
	f.Fuzz(func(t *testing.T, route uint8, body string) {
		r := proxyRoutes[int(route)%len(proxyRoutes)]
		before, _ := ledger.Verify(ctx, b.pool, "acme")
		callsBefore := calls
		req, _ := http.NewRequest(http.MethodPost, b.base+r.path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+b.key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode >= 500 {
			t.Fatalf("%s %q: %d %s", r.path, body, resp.StatusCode, raw)
		}
		if r.path == "/v1/messages/count_tokens" {
			after, err := ledger.Verify(ctx, b.pool, "acme")
			if err != nil || after.LastSeq != before.LastSeq || calls != callsBefore {
				t.Fatalf("count_tokens %q: %d, yet the ledger moved from %d to %d or the upstream was called (%v)", body, resp.StatusCode, before.LastSeq, after.LastSeq, err)
			}
		}
		if resp.StatusCode >= 400 {
			if strings.HasPrefix(r.path, "/v1/messages") && !strings.HasPrefix(string(raw), `{"type":"error","error":{"type":`) {
				t.Fatalf("%s %q: %d without an Anthropic error object: %s", r.path, body, resp.StatusCode, raw)
			}
			if !strings.Contains(string(raw), `"error":{`) || !strings.Contains(string(raw), `"type":`) {
				t.Fatalf("%s %q: %d without an OpenAI error object: %s", r.path, body, resp.StatusCode, raw)
			}
			after, err := ledger.Verify(ctx, b.pool, "acme")
			if err != nil || after.LastSeq != before.LastSeq || after.BalanceMicro != before.BalanceMicro {
				t.Fatalf("%s %q: refused with %d, yet the ledger moved from %d to %d (%v)", r.path, body, resp.StatusCode, before.LastSeq, after.LastSeq, err)
			}
			if calls != callsBefore {
				t.Fatalf("%s %q: refused with %d, yet the upstream was called", r.path, body, resp.StatusCode)
			}
		}
	})
}
