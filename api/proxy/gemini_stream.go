package proxy

import (
	"encoding/json"
	"net/http"
	"strings"

	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

// geminiUsage is Gemini's usageMetadata. Every count is the call's total
// so far: a stream restates it, grown, in each chunk.
type geminiUsage struct {
	PromptTokenCount        *int64 `json:"promptTokenCount"`
	CachedContentTokenCount *int64 `json:"cachedContentTokenCount"`
	CandidatesTokenCount    *int64 `json:"candidatesTokenCount"`
	ThoughtsTokenCount      *int64 `json:"thoughtsTokenCount"`
	ToolUsePromptTokenCount *int64 `json:"toolUsePromptTokenCount"`
	TotalTokenCount         *int64 `json:"totalTokenCount"`
	// TrafficType is Vertex AI's word for the tier that served the call
	// (ON_DEMAND, ON_DEMAND_PRIORITY, ON_DEMAND_FLEX,
	// PROVISIONED_THROUGHPUT); AI Studio states none.
	TrafficType string `json:"trafficType"`
}

// usage is u in tokengate's terms; false when u states no prompt count.
// Input is the prompt, the cached content in it (CacheRead, priced at the
// model's cached weight by the settle) and the tool-use prompt (a
// grounding search's or a code run's results, read by the model as input).
// Output is the total less every input: the candidates and the thoughts,
// each counted once whether a surface reports the thoughts inside
// candidatesTokenCount (some Vertex AI responses) or beside it (AI
// Studio's); candidates plus thoughts when no total is stated, or a total
// below the input. Each count is clamped (rule.ClampTokens) before any is
// added up. Tier is the tier trafficType names
// (estimator.ReadServiceTier), "" when it names none: the settle then
// charges the tier reserved.
func (u *geminiUsage) usage() (rule.Usage, bool) {
	if u == nil || u.PromptTokenCount == nil {
		return rule.Usage{}, false
	}
	prompt, toolUse := tokenCount(u.PromptTokenCount), tokenCount(u.ToolUsePromptTokenCount)
	out := tokenCount(u.CandidatesTokenCount) + tokenCount(u.ThoughtsTokenCount)
	if u.TotalTokenCount != nil {
		if rest := tokenCount(u.TotalTokenCount) - prompt - toolUse; rest >= 0 {
			out = rest
		}
	}
	return rule.Usage{Input: prompt + toolUse, Output: out, CacheRead: min(tokenCount(u.CachedContentTokenCount), prompt),
		Reasoning: tokenCount(u.ThoughtsTokenCount), Tier: estimator.ReadServiceTier(u.TrafficType)}, true
}

// geminiChunk is what the proxy reads of a GenerateContentResponse: a
// whole answer, an element of a streamed JSON array, or an SSE event.
type geminiChunk struct {
	Candidates []struct {
		Index        int    `json:"index"`
		FinishReason string `json:"finishReason"`
		Content      *struct {
			Parts []struct {
				Text         string          `json:"text"`
				FunctionCall json.RawMessage `json:"functionCall"`
			} `json:"parts"`
		} `json:"content"`
	} `json:"candidates"`
	PromptFeedback *struct {
		BlockReason string `json:"blockReason"`
	} `json:"promptFeedback"`
	UsageMetadata *geminiUsage    `json:"usageMetadata"`
	Error         json.RawMessage `json:"error"`
}

// geminiStreamReader reads a streamGenerateContent answer, in either of its
// forms (server-sent events with alt=sse, else one JSON array of
// responses, framed by jsonArray), every event or element relayed as it
// comes. Each one's usageMetadata is cumulative: the last
// one wins, and chunks are never summed, so a stream of N chunks is
// charged once. The usage is final once every candidate the stream has
// shown has its finishReason (or the prompt was blocked) and the event
// states a usage. A stream that
// breaks, or whose client leaves, is charged the last usage it stated,
// its output raised to the text and function calls streamed so far,
// counted as the estimate counts (o200k_base times
// estimator.GeminiSafetyFactorMilli); with no usage stated at all, the
// estimate's input. A stream the upstream broke off without an error
// event is silent: broken off to the client too. A stream that ended
// whole (every candidate finished) but stated no usage is an answer that
// states none: settled at its estimate, as a whole answer would be, and
// relayed whole.
type geminiStreamReader struct {
	est      estimator.Estimate
	out      outputCounter
	streamed strings.Builder
	last     *geminiUsage
	open     map[int]bool // the candidates seen, and whether each is unfinished
	final    bool
	sawError bool
}

// framing is how Gemini streams: server-sent events when asked for with
// alt=sse, else a streamGenerateContent answer is one JSON array whose
// elements are relayed as each arrives; every other answer is whole.
func (gemini) framing(rt route, h http.Header) framing {
	if fr := sseFraming(h); fr != nil || rt.api != geminiStream {
		return fr
	}
	return &jsonArray{}
}

func (gemini) stream(_ route, est estimator.Estimate, out outputCounter) streamReader {
	return &geminiStreamReader{est: est, out: out, open: map[int]bool{}}
}

func (s *geminiStreamReader) event(data []byte) (forward, final bool) {
	var c geminiChunk
	if len(data) == 0 || json.Unmarshal(data, &c) != nil {
		return true, false
	}
	if len(c.Error) > 0 && string(c.Error) != "null" {
		s.sawError = true
	}
	for _, cand := range c.Candidates {
		s.open[cand.Index] = cand.FinishReason == ""
		if cand.Content == nil {
			continue
		}
		for _, p := range cand.Content.Parts {
			s.streamed.WriteString(p.Text)
			if len(p.FunctionCall) > 0 {
				s.streamed.Write(p.FunctionCall)
			}
		}
	}
	if c.UsageMetadata != nil && c.UsageMetadata.PromptTokenCount != nil {
		s.last = c.UsageMetadata
	}
	if s.final || s.last == nil {
		return true, false
	}
	if c.PromptFeedback != nil && c.PromptFeedback.BlockReason != "" {
		// A blocked prompt: no candidate comes, and this is the answer.
		s.final = true
		return true, true
	}
	if len(c.Candidates) == 0 {
		return true, false
	}
	for _, unfinished := range s.open {
		if unfinished {
			return true, false
		}
	}
	s.final = true
	return true, true
}

// usage is the stream's usage: its last usageMetadata when it finished,
// else raised to what it streamed so far.
func (s *geminiStreamReader) usage() rule.Usage {
	u, ok := s.last.usage()
	if !ok && s.finished() {
		return rule.Usage{Input: s.est.InputTokens, Output: s.est.OutputTokens}
	}
	if !ok {
		u = rule.Usage{Input: s.est.InputTokens}
	}
	if streamed := s.streamed.String(); !s.final && streamed != "" {
		u.Output = max(u.Output, s.out.CountOutput(s.est, streamed))
	}
	return u
}

// silent: the stream ended without an error event before every candidate
// finished, so the upstream broke it off.
func (s *geminiStreamReader) silent() bool { return !s.sawError && !s.finished() }

// finished says whether every candidate the stream showed has its
// finishReason: the answer is whole, whatever usage it stated.
func (s *geminiStreamReader) finished() bool {
	if len(s.open) == 0 {
		return false
	}
	for _, unfinished := range s.open {
		if unfinished {
			return false
		}
	}
	return true
}
