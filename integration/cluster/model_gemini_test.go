//go:build cluster && soak

package cluster_test

import (
	"fmt"
	"net/http"
	"strings"
)

// The checker's model of the Gemini wire, written from its contract
// (docs/integrators.md, issue 38) and not from the proxy: a call is
// settled from the last usageMetadata its upstream stated, never the sum
// of a stream's chunks, as
//
//	input  = promptTokenCount + toolUsePromptTokenCount, of which
//	         cachedContentTokenCount (at most the prompt) is cached,
//	         charged at the cached weight (0.1 of an input token)
//	output = totalTokenCount - promptTokenCount - toolUsePromptTokenCount
//	         (the candidates and the thoughts, once each)
//
// clamped at the bound (output at most what was reserved, input and
// output at most the model's window or the reservation), and charged at
// weight 1 each. An answer that states no usage, or breaks off a whole
// generateContent answer, is settled at the estimate; a stream that breaks
// off (SSE or a JSON array, relayed an element at a time) is settled at
// the last usage it stated (the estimate's input if none), its output
// raised to the text it streamed, counted as the estimate counts. A call the upstream failed is
// released. countTokens is answered from the estimate and debits nothing.

// maxTokens is the most tokens any one count of a usage may state
// (docs/contract.md).
const maxTokens = 1_000_000_000

// geminiCost is what a settle of a Gemini call reserved as estIn input
// and estOut output tokens charges for in input tokens (cached of them
// cached) and out output tokens.
func geminiCost(estIn, estOut, in, out, cached int64) int64 {
	in, out = min(max(in, 0), maxTokens), min(max(out, 0), maxTokens)
	total := max(geminiWindow, estIn+estOut)
	out = min(out, estOut)
	in = min(in, total, total-out)
	cached = min(max(cached, 0), in)
	return in - cached + (cached+geminiCachedDivisor-1)/geminiCachedDivisor + out
}

// geminiStated is the settle of usage metadata g states with cand of the
// candidates' tokens (the stream's first chunk states 1 of them so far).
func geminiStated(g geminiPlan, cand int64) (in, out, cached int64) {
	total := g.prompt + g.toolUse + cand + g.thoughts // totalTokenCount, as metadata states it
	return g.prompt + g.toolUse, total - g.prompt - g.toolUse, min(g.cached, g.prompt)
}

// geminiSettles is the cost the proxy settles a Gemini call at that the
// upstream answered a, and whether the answer broke off; streamed is
// the output a broken stream's text counts, by candidates.
func geminiSettles(seen proxySeen, a providerAnswer, streamed [3]int64) (actual int64, broken bool) {
	estIn, estOut, g := seen.in, seen.maxOut, a.g
	switch {
	case g.brokenAfter == 0 && a.form == formArray:
		// The upstream broke its array off after the first element, which
		// was relayed whole: settled as an SSE stream broken after its
		// first chunk.
		b := a
		b.form, b.g.brokenAfter = formSSE, 1
		return geminiSettles(seen, b, streamed)
	case g.brokenAfter == 0 && a.form != formSSE:
		return estIn + estOut, true // the answer broke off: the estimate stands
	case g.brokenAfter == 0:
		return geminiCost(estIn, estOut, estIn, 0, 0), true // nothing stated, nothing streamed
	case g.brokenAfter == 1:
		in, out, cached := geminiStated(g, min(g.cand, 1))
		return geminiCost(estIn, estOut, in, max(out, streamed[a.candidates]), cached), true
	case !a.reported:
		return estIn + estOut, false
	}
	in, out, cached := geminiStated(g, g.cand)
	return geminiCost(estIn, estOut, in, out, cached), false
}

// geminiKind names how the upstream answered a call, for the checker's
// tally: broken off, with usage, or with none.
func geminiKind(a providerAnswer, broken bool) string {
	switch {
	case broken:
		return "broken"
	case a.reported:
		return "usage"
	}
	return "no usage"
}

// geminiLenient is what else a Gemini call the upstream answered may be
// settled at when a fault struck during it: its answer lost on the way
// (the estimate), or its client gone mid-stream (a stream, SSE or a JSON
// array, settled as if broken before its first chunk, or after it).
func geminiLenient(seen proxySeen, a providerAnswer, streamed [3]int64) []int64 {
	also := []int64{seen.in + seen.maxOut}
	if a.form == formSSE || a.form == formArray {
		for _, after := range []int{0, 1} {
			b := a
			b.form, b.g.brokenAfter = formSSE, after
			v, _ := geminiSettles(seen, b, streamed)
			also = append(also, v)
		}
	}
	return also
}

// geminiSeen is what the client of a Gemini call must have seen, with no
// fault going on, of the call the model settles or releases (want): the
// answer relayed whole (every candidate finished, usageMetadata as stated)
// or broken off as the upstream broke it (a stream, SSE or a JSON array,
// broken mid-way; a whole answer refused with 502), or the upstream's own
// failure. "" if it did.
func geminiSeen(want string, broken bool, answers []providerAnswer, admitted event) string {
	seen := admitted.proxy
	switch {
	case want == "release" && len(answers) > 0 && admitted.code != answers[0].status:
		return fmt.Sprintf("the upstream answered %d; the client saw %d %s", answers[0].status, admitted.code, admitted.typ)
	case want != "settle":
	case broken && seen.form == formArray && (admitted.code != http.StatusOK || !strings.HasPrefix(admitted.typ, "answer broken") || seen.sawFinish):
		return fmt.Sprintf("the upstream broke its array stream off; the client saw %d %q, finished %t", admitted.code, admitted.typ, seen.sawFinish)
	case broken && seen.form == formGenerate && admitted.code != http.StatusBadGateway:
		return fmt.Sprintf("the upstream broke its %s answer off; the client saw %d %s, not a 502", seen.form, admitted.code, admitted.typ)
	case broken && seen.form == formSSE && (admitted.code != http.StatusOK || !strings.HasPrefix(admitted.typ, "stream broken") || seen.sawFinish):
		return fmt.Sprintf("the upstream broke its stream off; the client saw %d %q, finished %t", admitted.code, admitted.typ, seen.sawFinish)
	case !broken && (admitted.code != http.StatusOK || admitted.typ != "" || !seen.sawFinish || seen.sawUsage != answers[0].reported):
		return fmt.Sprintf("the upstream answered 200 (usage stated %t); the client saw %d %q, finished %t, usage %t",
			answers[0].reported, admitted.code, admitted.typ, seen.sawFinish, seen.sawUsage)
	}
	return ""
}

// checkGeminiEvents holds the Gemini wire's answers to what they must be:
// a refusal is Google's 429 RESOURCE_EXHAUSTED with a RetryInfo; a
// countTokens names no admission (nor debits: the checker's count of
// admissions no client was told of would find it) and answers the
// prompt's input as the estimate counts it; and the upstream never saw a
// count, a tenant's key, or a call no client planned.
func checkGeminiEvents(h *history, up *provider) (problems []string, counts map[string]int) {
	fail := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	counts = map[string]int{}
	for _, e := range h.events {
		if !e.proxy.gemini {
			continue
		}
		if e.code == http.StatusTooManyRequests && (!strings.HasPrefix(e.typ, "RESOURCE_EXHAUSTED/") || !e.proxy.retryInfo) {
			fail("gemini call %s (%s): a refusal answered %q, retry info %t", e.proxy.call, e.tenant, e.typ, e.proxy.retryInfo)
		}
		if e.op != "count" {
			continue
		}
		counts[fmt.Sprint(e.code)]++
		switch {
		case e.admission != "":
			fail("gemini count %s (%s): countTokens named admission %s", e.proxy.call, e.tenant, e.admission)
		case e.code == http.StatusOK && (e.proxy.counted != e.proxy.in || e.proxy.countedBy != "estimate"):
			fail("gemini count %s (%s): countTokens answered %d (X-Tokengate-Count %q); the prompt's input is %d",
				e.proxy.call, e.tenant, e.proxy.counted, e.proxy.countedBy, e.proxy.in)
		case e.code != http.StatusOK && e.code != 0 && e.code < 500:
			fail("gemini count %s (%s): countTokens answered %d %s", e.proxy.call, e.tenant, e.code, e.typ)
		}
	}
	for _, s := range up.stray() {
		fail("the upstream got %s", s)
	}
	return problems, counts
}
