//go:build cluster && soak

package cluster_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
)

// The soak's clients of the Gemini wire: the same proxy as the OpenAI
// clients', in front of the same emulated upstream (provider_gemini_test.go),
// admitting against the same tenants, and held by the checker to what the
// upstream's usageMetadata says (model_gemini_test.go).

// geminiBody is a generateContent body for prompt p: maxOut tokens a
// candidate, cands candidates, and a thinking budget if thinking >= 0. An
// odd prompt has a system instruction too.
func geminiBody(p int, maxOut, cands, thinking int64) string {
	system := ""
	if p%2 == 1 {
		system = `,"systemInstruction":{"parts":[{"text":"answer the soak"}]}`
	}
	cfg := fmt.Sprintf(`"maxOutputTokens":%d`, maxOut)
	if cands > 1 {
		cfg += fmt.Sprintf(`,"candidateCount":%d`, cands)
	}
	if thinking >= 0 {
		cfg += fmt.Sprintf(`,"thinkingConfig":{"thinkingBudget":%d}`, thinking)
	}
	return fmt.Sprintf(`{"contents":[{"role":"user","parts":[{"text":%q}]}]%s,"generationConfig":{%s}}`,
		strings.Repeat("gemini soak ", p+1), system, cfg)
}

// textBody is a countTokens body of one text.
func textBody(text string) string {
	return fmt.Sprintf(`{"contents":[{"role":"user","parts":[{"text":%q}]}]}`, text)
}

// geminiMeasured is what the soak measured of the Gemini wire's estimate,
// by countTokens (which debits nothing): the input tokens of each prompt,
// and the output a broken stream is charged for the text it streamed (o200k_base
// times Gemini's factor: "o" of each of 1 or 2 candidates).
type geminiMeasured struct {
	prompts  []int64
	streamed [3]int64 // by candidates
}

// measureGemini counts each prompt, and the streamed text as the
// difference between a body of it and one of "" (the framing is the same).
func measureGemini(t *testing.T, proxyURL, key string) geminiMeasured {
	t.Helper()
	count := func(body string) int64 {
		code, typ, n, adm, how := geminiCountCall(proxyURL+"/v1beta/models/"+geminiModel+":countTokens", http.Header{"X-Goog-Api-Key": {key}}, body)
		if code != http.StatusOK || adm != "" || how != "estimate" {
			t.Fatalf("countTokens of %s: %d %s, admission %q, X-Tokengate-Count %q", body, code, typ, adm, how)
		}
		return n
	}
	var m geminiMeasured
	for p := range prompts {
		m.prompts = append(m.prompts, count(geminiBody(p, 7, 1, -1)))
	}
	empty := count(textBody(""))
	for n := 1; n <= 2; n++ {
		m.streamed[n] = count(textBody(strings.Repeat("o", n))) - empty
	}
	t.Logf("soak: Gemini prompts count %v input tokens; a broken stream's \"o\" of 1 and 2 candidates %d and %d output tokens",
		m.prompts, m.streamed[1], m.streamed[2])
	return m
}

// geminiClient is a frontend of the Gemini wire (an SDK pointed at the
// proxy), on AI Studio's paths or Vertex AI's, its key in x-goog-api-key,
// ?key= or a bearer token: generateContent, streamGenerateContent as SSE
// or as a JSON array, with one or two candidates and a thinking budget or
// none, with an Idempotency-Key (retried with it) or without; and now and
// then countTokens, which must debit nothing. The upstream states usage
// with cached content, a tool-use prompt and thoughts (beside the
// candidates, or inside them as Vertex AI may), below or at what was
// reserved, more output than reserved, absurd, none (a whole answer), or
// breaks the answer off (a stream before or after its first chunk), or
// fails with a 500 before any output.
func (w *workload) geminiClient(r *rand.Rand, id int, stop <-chan struct{}) {
	for n := 0; ; n++ {
		select {
		case <-stop:
			return
		default:
		}
		tenant := w.names[r.IntN(len(w.names))]
		p, maxOut, cands, thinking := r.IntN(prompts), int64(1+r.IntN(200)), int64(1), int64(-1)
		if r.IntN(4) == 0 {
			cands = 2
		}
		if r.IntN(3) == 0 {
			thinking = int64(r.IntN(200))
		}
		in := w.gemini.prompts[p]
		seen := proxySeen{call: fmt.Sprintf("g%d-%d", id, n), in: in, maxOut: maxOut*cands + max(thinking, 0), gemini: true,
			form: []string{formGenerate, formSSE, formArray}[r.IntN(3)], vertex: r.IntN(2) == 0, keyVia: r.IntN(3), cands: int(cands)}
		seen.stream = seen.form != formGenerate
		body := geminiBody(p, maxOut, cands, thinking)
		if r.IntN(10) == 0 {
			w.geminiCount(r, id, tenant, body, seen)
			continue
		}
		g := &geminiPlan{prompt: in + int64(r.IntN(3)), cand: int64(r.IntN(int(maxOut*cands) + 1)), vertexTotals: r.IntN(2) == 0, brokenAfter: -1}
		if thinking > 0 {
			g.thoughts = int64(r.IntN(int(thinking) + 1))
		}
		if r.IntN(3) == 0 {
			g.cached = int64(r.IntN(int(g.prompt) + 1))
		}
		if r.IntN(5) == 0 {
			g.toolUse = int64(1 + r.IntN(20))
		}
		plan := providerPlan{usage: true, gemini: g}
		switch x := r.IntN(200); {
		case x < 25:
			plan.fail = true
		case x < 35 && seen.form != formSSE:
			plan.usage = false // Gemini always states it; the estimate stands
		case x < 50:
			g.cand = maxOut*cands + 1 + int64(r.IntN(20)) // more than reserved: clamped
		case x < 51:
			g.prompt, g.cand = 900_000_000, 900_000_000
		case x < 75:
			g.brokenAfter = 0
			if seen.form == formSSE {
				g.brokenAfter = r.IntN(2)
			}
		}
		if r.IntN(4) == 0 {
			plan.delay = time.Duration(r.IntN(300)) * time.Millisecond
		}
		w.provider.plan(seen.call, plan)
		idem := ""
		if r.IntN(3) > 0 {
			idem = seen.call
		}
		for attempt := 0; attempt < 4; attempt++ {
			e := event{face: faceProxy, client: id, op: "call", tenant: tenant, key: proxyKey(idem), body: body, begin: time.Since(w.h.start),
				reservedCost: seen.in + seen.maxOut}
			rep := w.pick(r)
			e.replica = rep.name
			e.code, e.typ, e.admission, e.retryAfter, e.proxy = geminiCall(rep.proxyURL, w.keys[tenant], idem, body, seen)
			e.end = time.Since(w.h.start)
			w.h.add(e)
			if e.admission != "" || idem == "" || e.code != 0 && e.code < 500 {
				break // told of an admission, refused, or not to be retried
			}
			clientPause(100 * time.Millisecond)
		}
	}
}

// geminiCount asks countTokens of a body, on the path and with the key
// the call would have used: answered from the estimate, never admitted,
// never sent upstream.
func (w *workload) geminiCount(r *rand.Rand, id int, tenant, body string, seen proxySeen) {
	seen.call, seen.form = seen.call+"-count", "count"
	e := event{face: faceProxy, client: id, op: "count", tenant: tenant, body: body, begin: time.Since(w.h.start)}
	rep := w.pick(r)
	e.replica = rep.name
	u, hdr := geminiURL(rep.proxyURL, w.keys[tenant], "countTokens", seen)
	var how string
	e.code, e.typ, seen.counted, e.admission, how = geminiCountCall(u, hdr, body)
	seen.countedBy = how
	e.proxy, e.end = seen, time.Since(w.h.start)
	w.h.add(e)
}

// geminiURL is the call's URL on the proxy (AI Studio's path or Vertex
// AI's; alt=sse for an SSE stream; the key as ?key= if the call sends it
// so) and the header that carries the key otherwise.
func geminiURL(proxyURL, key, action string, seen proxySeen) (string, http.Header) {
	p := "/v1beta/models/" + geminiModel
	if seen.vertex {
		p = "/v1/projects/soak/locations/us-central1/publishers/google/models/" + geminiModel
	}
	q := url.Values{}
	if seen.form == formSSE && action == "streamGenerateContent" {
		q.Set("alt", "sse")
	}
	hdr := http.Header{}
	switch seen.keyVia {
	case 0:
		hdr.Set("X-Goog-Api-Key", key)
	case 1:
		q.Set("key", key)
	default:
		hdr.Set("Authorization", "Bearer "+key)
	}
	u := proxyURL + p + ":" + action
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	return u, hdr
}

// geminiCountCall sends a countTokens to u with the headers in hdr (the
// key's), and reads the count, or Google's error, the admission named if
// any (none may be) and X-Tokengate-Count (how it was counted).
func geminiCountCall(u string, hdr http.Header, body string) (code int, typ string, total int64, admission, countedBy string) {
	req, err := http.NewRequest("POST", u, strings.NewReader(body))
	if err != nil {
		return 0, err.Error(), 0, "", ""
	}
	for k, vs := range hdr {
		req.Header[k] = vs
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return 0, "transport: " + err.Error(), 0, "", ""
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var v struct {
		TotalTokens int64 `json:"totalTokens"`
	}
	if resp.StatusCode == http.StatusOK {
		_ = json.Unmarshal(raw, &v)
	} else {
		typ, _ = googleError(raw)
	}
	return resp.StatusCode, typ, v.TotalTokens, resp.Header.Get("X-Tokengate-Admission"), resp.Header.Get("X-Tokengate-Count")
}

// googleError reads Google's error body: its status and its ErrorInfo's
// reason ("RESOURCE_EXHAUSTED/BUDGET_EXHAUSTED"), and whether it carries a
// RetryInfo with a retryDelay.
func googleError(raw []byte) (typ string, retryDelay bool) {
	var v struct {
		Error struct {
			Status  string `json:"status"`
			Details []struct {
				Type       string `json:"@type"`
				Reason     string `json:"reason"`
				RetryDelay string `json:"retryDelay"`
			} `json:"details"`
		} `json:"error"`
	}
	if json.Unmarshal(raw, &v) != nil {
		return "", false
	}
	typ = v.Error.Status
	for _, d := range v.Error.Details {
		switch d.Type {
		case "type.googleapis.com/google.rpc.ErrorInfo":
			typ += "/" + d.Reason
		case "type.googleapis.com/google.rpc.RetryInfo":
			retryDelay = retryDelay || d.RetryDelay != ""
		}
	}
	return typ, retryDelay
}

// geminiCall sends one generateContent or streamGenerateContent and reads
// what the client sees: the status, Google's error (and its RetryInfo),
// the admission named by X-Tokengate-Admission, a refusal's Retry-After
// and, of an answer, whether every candidate finished and the last
// response carried usageMetadata (a stream's SSE events, or its JSON
// array's elements).
func geminiCall(proxyURL, key, idem, body string, seen proxySeen) (code int, typ, admission, retryAfter string, _ proxySeen) {
	action := "generateContent"
	if seen.stream {
		action = "streamGenerateContent"
	}
	u, hdr := geminiURL(proxyURL, key, action, seen)
	req, err := http.NewRequest("POST", u, strings.NewReader(body))
	if err != nil {
		return 0, err.Error(), "", "", seen
	}
	for k, vs := range hdr {
		req.Header[k] = vs
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Soak-Call", seen.call)
	if idem != "" {
		req.Header.Set("Idempotency-Key", idem)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, "transport: " + err.Error(), "", "", seen
	}
	defer resp.Body.Close()
	admission, retryAfter = resp.Header.Get("X-Tokengate-Admission"), resp.Header.Get("Retry-After")
	var responses []string
	if resp.StatusCode == http.StatusOK && strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if data, ok := strings.CutPrefix(strings.TrimRight(sc.Text(), "\r"), "data: "); ok {
				responses = append(responses, data)
			}
		}
		if sc.Err() != nil {
			typ = "stream broken: " + sc.Err().Error()
		}
		seen.sawFinish, seen.sawUsage = geminiSaw(responses, seen.cands)
		return resp.StatusCode, typ, admission, retryAfter, seen
	}
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		typ = "answer broken: " + err.Error()
	}
	if resp.StatusCode != http.StatusOK {
		if t, delay := googleError(raw); t != "" {
			typ, seen.retryInfo = t, delay
		}
		return resp.StatusCode, typ, admission, retryAfter, seen
	}
	var elems []json.RawMessage
	if seen.stream && json.Unmarshal(raw, &elems) == nil {
		for _, e := range elems {
			responses = append(responses, string(e))
		}
	} else {
		responses = []string{string(raw)}
	}
	seen.sawFinish, seen.sawUsage = geminiSaw(responses, seen.cands)
	return resp.StatusCode, typ, admission, retryAfter, seen
}

// geminiSaw reports whether the responses finished all n candidates, and
// whether the last one stated usageMetadata.
func geminiSaw(responses []string, n int) (finished, usage bool) {
	done := map[int]bool{}
	for i, r := range responses {
		var v struct {
			Candidates []struct {
				Index        int    `json:"index"`
				FinishReason string `json:"finishReason"`
			} `json:"candidates"`
			UsageMetadata json.RawMessage `json:"usageMetadata"`
		}
		if json.Unmarshal([]byte(r), &v) != nil {
			continue
		}
		for _, c := range v.Candidates {
			if c.FinishReason != "" {
				done[c.Index] = true
			}
		}
		if i == len(responses)-1 {
			usage = len(v.UsageMetadata) > 0
		}
	}
	return len(done) == n, usage
}
