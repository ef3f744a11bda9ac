package proxy

import (
	"encoding/json"
	"net/http"
	"strings"

	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

// anthropicUsage is Anthropic's usage object, in a whole answer, in
// message_start's message and in message_delta (where each field given is
// the total so far: merge).
type anthropicUsage struct {
	InputTokens              *int64 `json:"input_tokens"`
	OutputTokens             *int64 `json:"output_tokens"`
	CacheCreationInputTokens *int64 `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     *int64 `json:"cache_read_input_tokens"`
	CacheCreation            *struct {
		Ephemeral5m *int64 `json:"ephemeral_5m_input_tokens"`
		Ephemeral1h *int64 `json:"ephemeral_1h_input_tokens"`
	} `json:"cache_creation"`
	// ServiceTier is the tier that served the call ("standard",
	// "priority", "batch"), in message_start's usage and the answer's.
	ServiceTier *string `json:"service_tier"`
}

// complete says whether u states both input and output.
func (u *anthropicUsage) complete() bool {
	return u != nil && u.InputTokens != nil && u.OutputTokens != nil
}

// tokenCount reads one reported count: absent is 0, and each is clamped
// (rule.ClampTokens) before any is added up.
func tokenCount(p *int64) int64 {
	if p == nil {
		return 0
	}
	return rule.ClampTokens(*p)
}

// mergeAnthropic applies the fields u gives over m's (a stream's
// message_delta over its message_start), in tokengate's terms: Anthropic's
// input_tokens excludes the cache's reads and writes, which m's Input
// adds up. Anthropic's counts are cumulative: each one message_delta
// states is the total so far, never less than message_start said. So a
// field takes the larger of what is known and what u says: a zero or an
// absent field (a message_delta with input_tokens 0, as some relays write
// it) never erases a known count, and a later, larger total replaces an
// earlier one. The cache's writes are one total; their split by lifetime
// is u's when it states one for a total at least as large, else the 1
// hour part known so far, the rest at 5 minutes.
func mergeAnthropic(m *rule.Usage, u *anthropicUsage) {
	if u == nil {
		return
	}
	uncached := m.Input - m.CacheRead - m.CacheWrite5m - m.CacheWrite1h
	if u.InputTokens != nil {
		uncached = max(uncached, tokenCount(u.InputTokens))
	}
	if u.OutputTokens != nil {
		m.Output = max(m.Output, tokenCount(u.OutputTokens))
	}
	if u.CacheReadInputTokens != nil {
		m.CacheRead = max(m.CacheRead, tokenCount(u.CacheReadInputTokens))
	}
	if u.CacheCreationInputTokens != nil {
		if written := tokenCount(u.CacheCreationInputTokens); written >= m.CacheWrite5m+m.CacheWrite1h {
			m.CacheWrite1h = min(m.CacheWrite1h, written)
			if cc := u.CacheCreation; cc != nil && cc.Ephemeral1h != nil {
				m.CacheWrite1h = min(tokenCount(cc.Ephemeral1h), written)
			}
			m.CacheWrite5m = written - m.CacheWrite1h
		}
	}
	m.Input = uncached + m.CacheRead + m.CacheWrite5m + m.CacheWrite1h
	if u.ServiceTier != nil {
		if t := estimator.ReadServiceTier(*u.ServiceTier); t != "" {
			m.Tier = t
		}
	}
}

// messagesEvent is what the proxy reads of one Messages stream event.
type messagesEvent struct {
	Type    string `json:"type"`
	Message *struct {
		Usage *anthropicUsage `json:"usage"`
	} `json:"message"`
	Delta *struct {
		Type        string `json:"type"`
		Text        string `json:"text"`
		Thinking    string `json:"thinking"`
		PartialJSON string `json:"partial_json"`
	} `json:"delta"`
	Usage *anthropicUsage `json:"usage"`
}

// messagesStream reads a Messages stream (message_start, content_block_*,
// message_delta, message_stop, ping, error), every event relayed as it
// comes, for the usage of message_start (input and the cache's) and
// message_delta (output, and any total it restates): final at
// message_stop. A stream that breaks, or whose client leaves, is charged
// what was streamed so far: message_start's input (else the estimate's)
// and the larger of the last output count and the streamed text, thinking
// and tool input, counted as the estimate counts (o200k_base times the
// family's safety factor). A stream the upstream broke off without an
// error event is silent: broken off to the client too.
type messagesStream struct {
	est                        estimator.Estimate
	out                        outputCounter
	streamed                   strings.Builder
	u                          rule.Usage
	started, stopped, sawError bool
}

func (anthropic) framing(_ route, h http.Header) framing { return sseFraming(h) }

func (anthropic) stream(_ route, est estimator.Estimate, out outputCounter) streamReader {
	return &messagesStream{est: est, out: out}
}

func (s *messagesStream) event(data []byte) (forward, final bool) {
	var ev messagesEvent
	if len(data) == 0 || json.Unmarshal(data, &ev) != nil {
		return true, false
	}
	switch ev.Type {
	case "message_start":
		if ev.Message != nil && ev.Message.Usage != nil {
			mergeAnthropic(&s.u, ev.Message.Usage)
			s.started = true
		}
	case "content_block_delta":
		if ev.Delta != nil {
			s.streamed.WriteString(ev.Delta.Text)
			s.streamed.WriteString(ev.Delta.Thinking)
			s.streamed.WriteString(ev.Delta.PartialJSON)
		}
	case "message_delta":
		mergeAnthropic(&s.u, ev.Usage)
	case "error":
		s.sawError = true
	case "message_stop":
		s.stopped = true
		return true, true
	}
	return true, false
}

// usage is the stream's usage: as reported when it finished, else with
// what it streamed so far counted as output. Anthropic's usage does not
// split out thinking.
func (s *messagesStream) usage() rule.Usage {
	u := s.u
	if !s.started {
		// No message_start: nothing says what the input was; the
		// estimate's input stands, without any cache.
		u = rule.Usage{Input: s.est.InputTokens, Output: u.Output}
	}
	if streamed := s.streamed.String(); !s.stopped && streamed != "" {
		u.Output = max(u.Output, s.out.CountOutput(s.est, streamed))
	}
	return u
}

func (s *messagesStream) silent() bool { return !s.sawError }
