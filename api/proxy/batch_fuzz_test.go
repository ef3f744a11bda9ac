package proxy_test

import (
	"bytes"
	"io"
	"mime/multipart"
	"net/http"
	"strings"
	"testing"
)

// FuzzBatchBodies sends arbitrary batch input files (OpenAI's, as a
// multipart upload) and Message Batches bodies (Anthropic's) to the proxy,
// in front of emulated upstreams. Whatever the body: never a 5xx, every
// 4xx is the wire's error object, and a refused one reserves nothing and
// never reaches the upstream.
func FuzzBatchBodies(f *testing.F) {
	f.Add(false, chatLine("a", "gpt-4o", 10)+"\n"+chatLine("b", "gpt-4o", 20))
	f.Add(false, `{"custom_id":"e","method":"POST","url":"/v1/embeddings","body":{"model":"text-embedding-3-small","input":["a","b"]}}`)
	f.Add(false, `{"custom_id":"r","method":"POST","url":"/v1/responses","body":{"model":"gpt-4o","input":"hi","max_output_tokens":9223372036854775807}}`)
	f.Add(false, `{"custom_id":"c","method":"POST","url":"/v1/completions","body":{"model":"gpt-4o","prompt":["a","b"],"max_tokens":5}}`+"\n\n"+`{"custom_id":"c","method":"GET"}`)
	f.Add(false, "\x00{\n}\n[]")
	f.Add(true, `{"requests":[{"custom_id":"a","params":{"model":"claude-sonnet-4-5","max_tokens":50,"messages":[{"role":"user","content":"hi"}]}}]}`)
	f.Add(true, `{"requests":[{"custom_id":"a","params":{"model":"claude-sonnet-4-5","max_tokens":-1,"messages":[]}},{"custom_id":"a"}]}`)
	f.Add(true, `{"requests":{}}`)
	b := setupBatches(f, 1_000_000_000)
	anthro := b.anthro
	f.Fuzz(func(t *testing.T, messages bool, body string) {
		before := b.enqueued(t)
		b.up.mu.Lock()
		uploads := b.up.uploads
		b.up.mu.Unlock()
		anthro.mu.Lock()
		creates := anthro.creates
		anthro.mu.Unlock()
		var req *http.Request
		if messages {
			req, _ = http.NewRequest(http.MethodPost, b.base+"/v1/messages/batches", strings.NewReader(body))
			req.Header.Set("X-Api-Key", b.key)
		} else {
			var buf bytes.Buffer
			mw := multipart.NewWriter(&buf)
			_ = mw.WriteField("purpose", "batch")
			fw, _ := mw.CreateFormFile("file", "batch.jsonl")
			_, _ = fw.Write([]byte(body))
			_ = mw.Close()
			req, _ = http.NewRequest(http.MethodPost, b.base+"/v1/files", &buf)
			req.Header.Set("Content-Type", mw.FormDataContentType())
			req.Header.Set("Authorization", "Bearer "+b.key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode >= 500 {
			t.Fatalf("%q: %d %s", body, resp.StatusCode, raw)
		}
		if resp.StatusCode < 400 {
			return
		}
		if messages && !strings.HasPrefix(string(raw), `{"type":"error","error":{"type":`) ||
			!messages && !strings.HasPrefix(string(raw), `{"error":{"message":`) {
			t.Fatalf("%q: %d without the wire's error object: %s", body, resp.StatusCode, raw)
		}
		b.up.mu.Lock()
		called := b.up.uploads != uploads
		b.up.mu.Unlock()
		anthro.mu.Lock()
		called = called || anthro.creates != creates
		anthro.mu.Unlock()
		if b.enqueued(t) != before || called {
			t.Fatalf("%q: refused with %d, yet it was reserved or reached the upstream", body, resp.StatusCode)
		}
	})
}
