//go:build cluster && soak

package cluster_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path"
	"strings"
	"time"
)

// The emulated provider's Gemini side: the replicas' proxies reach it as
// their --gemini-upstream (TOKENGATE_GEMINI_UPSTREAM), on AI Studio's and
// Vertex AI's paths. A call names its plan in the X-Soak-Call header, which
// the proxy forwards as it forwards every header but credentials (a Gemini
// body has no field of the caller's own, as OpenAI's "user").

// soakGeminiKey is tokengate's own Gemini key (TOKENGATE_GEMINI_UPSTREAM_KEY):
// the only key the upstream may see.
const soakGeminiKey = "soak-gemini-upstream-key"

// geminiModel is the soak's Gemini model, as the seeded model table has
// it (estimator/gemini.go): input and output weigh 1 each, cached content
// 0.1 of an input token, and it takes 1,048,576 input tokens and writes
// up to 65,536, which bound a settle's usage together.
const (
	geminiModel         = "gemini-2.5-flash"
	geminiWindow        = 1_048_576 + 65_536
	geminiCachedDivisor = 10 // an input token costs what 10 cached ones do
)

// The Gemini forms a call takes: a whole answer (generateContent), and
// streamGenerateContent with alt=sse or as its default JSON array.
const (
	formGenerate = "generate"
	formSSE      = "sse"
	formArray    = "array"
)

// geminiPlan is how the upstream states a Gemini call's usageMetadata,
// and whether it breaks its answer off.
type geminiPlan struct {
	prompt, cached, toolUse int64 // promptTokenCount, cachedContentTokenCount, toolUsePromptTokenCount
	cand, thoughts          int64 // the candidates' tokens (all of them), thoughtsTokenCount
	// vertexTotals states the thoughts inside candidatesTokenCount too (as
	// some Vertex AI answers do) rather than beside it (AI Studio's):
	// totalTokenCount is the same either way.
	vertexTotals bool
	// brokenAfter breaks the answer off after that many stream chunks (0
	// or 1, before the final one; a whole answer or a JSON array breaks
	// mid-body at 0); -1: the answer is whole.
	brokenAfter int
}

// metadata is the cumulative usageMetadata with cand candidates' tokens so
// far.
func (g geminiPlan) metadata(cand int64) string {
	candidates := cand
	if g.vertexTotals {
		candidates += g.thoughts
	}
	s := fmt.Sprintf(`{"promptTokenCount":%d,"candidatesTokenCount":%d,"totalTokenCount":%d`, g.prompt, candidates, g.prompt+g.toolUse+cand+g.thoughts)
	if g.cached > 0 {
		s += fmt.Sprintf(`,"cachedContentTokenCount":%d`, g.cached)
	}
	if g.toolUse > 0 {
		s += fmt.Sprintf(`,"toolUsePromptTokenCount":%d`, g.toolUse)
	}
	if g.thoughts > 0 {
		s += fmt.Sprintf(`,"thoughtsTokenCount":%d`, g.thoughts)
	}
	return s + "}"
}

// geminiChunk is one GenerateContentResponse: n candidates with text (and
// finishReason STOP if finish), and usage if it is not "".
func geminiChunk(n int, text string, finish bool, usage string) string {
	var cands []string
	for i := range n {
		fin := ""
		if finish {
			fin = `,"finishReason":"STOP"`
		}
		cands = append(cands, fmt.Sprintf(`{"content":{"role":"model","parts":[{"text":%q}]},"index":%d%s}`, text, i, fin))
	}
	s := `{"candidates":[` + strings.Join(cands, ",") + `],"modelVersion":"` + geminiModel + `"`
	if usage != "" {
		s += `,"usageMetadata":` + usage
	}
	return s + "}"
}

// serveGemini answers a Gemini call as its plan says: a 500 in Google's
// shape before any output, or the answer in the form the call asked for,
// with its usageMetadata (cumulative in every chunk of a stream: 1 token
// so far in the first, all in the last), or broken off. What the proxy
// forwarded that it must not (the tenant's key; a count, which tokengate
// answers itself) is a stray the checker reports.
func (u *provider) serveGemini(w http.ResponseWriter, r *http.Request) {
	raw, _ := io.ReadAll(r.Body)
	id := r.Header.Get("X-Soak-Call")
	var body struct {
		GenerationConfig struct {
			CandidateCount int `json:"candidateCount"`
		} `json:"generationConfig"`
	}
	_ = json.Unmarshal(raw, &body)
	n := max(1, body.GenerationConfig.CandidateCount)
	_, action, _ := strings.Cut(path.Base(r.URL.Path), ":")
	a := providerAnswer{status: http.StatusOK, gemini: true, candidates: n}
	switch action {
	case "generateContent":
		a.form = formGenerate
	case "streamGenerateContent":
		a.form, a.stream = formArray, true
		if r.URL.Query().Get("alt") == "sse" {
			a.form = formSSE
		}
	}
	u.mu.Lock()
	p, ok := u.plans[id]
	u.mu.Unlock()
	var stray []string
	if k := r.Header.Get("X-Goog-Api-Key"); k != soakGeminiKey {
		stray = append(stray, fmt.Sprintf("x-goog-api-key %q, not tokengate's", k))
	}
	if r.Header.Get("Authorization") != "" || r.URL.Query().Has("key") {
		stray = append(stray, "a tenant's key forwarded (Authorization, or ?key=)")
	}
	switch {
	case a.form == "" || !ok || p.gemini == nil:
		stray = append(stray, fmt.Sprintf("%s %s for call %q, which no Gemini call planned", r.Method, r.URL.Path, id))
		a.status = http.StatusBadRequest
	case p.fail:
		a.status = http.StatusInternalServerError
	default:
		a.g, a.reported = *p.gemini, p.usage
	}
	u.mu.Lock()
	u.answered[id] = append(u.answered[id], a)
	for _, s := range stray {
		u.strays = append(u.strays, "gemini call "+id+": "+s)
	}
	u.mu.Unlock()
	time.Sleep(p.delay) // real time: the provider's latency, as a real upstream's, keeps calls in flight
	if a.status != http.StatusOK {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(a.status)
		fmt.Fprintf(w, `{"error":{"code":%d,"message":"the soak's upstream failed this call","status":"INTERNAL"}}`, a.status)
		return
	}
	g := a.g
	usage := func(cand int64) string {
		if !a.reported {
			return ""
		}
		return g.metadata(cand)
	}
	// The first chunk has "o" of each candidate and a token of it so far;
	// the last, "k" and every token.
	chunks := []string{geminiChunk(n, "o", false, usage(min(g.cand, 1))), geminiChunk(n, "k", true, usage(g.cand))}
	switch a.form {
	case formSSE:
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		for i, c := range chunks {
			if i == g.brokenAfter {
				panic(http.ErrAbortHandler) // the connection dies: no final chunk, no error event
			}
			fmt.Fprintf(w, "data: %s\r\n\r\n", c)
			w.(http.Flusher).Flush()
		}
		return
	case formArray:
		// A JSON array, sent an element at a time, as Google's.
		w.Header().Set("Content-Type", "application/json")
		for i, c := range chunks {
			if i == 0 {
				fmt.Fprint(w, "[")
			} else {
				fmt.Fprint(w, ",\r\n")
			}
			fmt.Fprint(w, c)
			w.(http.Flusher).Flush()
			if g.brokenAfter == 0 {
				panic(http.ErrAbortHandler) // broken mid-array
			}
		}
		fmt.Fprint(w, "]")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	whole := geminiChunk(n, "ok", true, usage(g.cand))
	if g.brokenAfter == 0 {
		w.Header().Set("Content-Length", fmt.Sprint(len(whole)))
		fmt.Fprint(w, whole[:len(whole)/2])
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler) // broken mid-body
	}
	fmt.Fprint(w, whole)
}
