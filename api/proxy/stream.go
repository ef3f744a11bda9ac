package proxy

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"strings"

	"github.com/tokengate/tokengate/estimator"
)

// usage is what a call used, as the upstream reports it: input (cached
// included, with how many were cached) and output (reasoning included,
// with how many were reasoning).
type usage struct {
	input, cached, output, reasoning int64
}

// wireUsage reads the usage objects of the three APIs.
type wireUsage struct {
	PromptTokens        *int64 `json:"prompt_tokens"`
	CompletionTokens    *int64 `json:"completion_tokens"`
	InputTokens         *int64 `json:"input_tokens"`
	OutputTokens        *int64 `json:"output_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
	InputTokensDetails *struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	CompletionTokensDetails *struct {
		ReasoningTokens int64 `json:"reasoning_tokens"`
	} `json:"completion_tokens_details"`
	OutputTokensDetails *struct {
		ReasoningTokens int64 `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
}

func (w *wireUsage) usage() (usage, bool) {
	if w == nil {
		return usage{}, false
	}
	var u usage
	switch {
	case w.PromptTokens != nil && w.CompletionTokens != nil:
		u.input, u.output = *w.PromptTokens, *w.CompletionTokens
		if w.PromptTokensDetails != nil {
			u.cached = w.PromptTokensDetails.CachedTokens
		}
		if w.CompletionTokensDetails != nil {
			u.reasoning = w.CompletionTokensDetails.ReasoningTokens
		}
	case w.InputTokens != nil && w.OutputTokens != nil:
		u.input, u.output = *w.InputTokens, *w.OutputTokens
		if w.InputTokensDetails != nil {
			u.cached = w.InputTokensDetails.CachedTokens
		}
		if w.OutputTokensDetails != nil {
			u.reasoning = w.OutputTokensDetails.ReasoningTokens
		}
	default:
		return usage{}, false
	}
	if u.input < 0 || u.output < 0 || u.input > 1_000_000_000 || u.output > 1_000_000_000 {
		return usage{}, false
	}
	return u, true
}

// readUsage reads the usage of a whole (not streamed) answer.
func readUsage(k kind, body []byte) (usage, bool) {
	if k == embeddings {
		return readEmbeddingsUsage(body)
	}
	var v struct {
		Usage *wireUsage `json:"usage"`
	}
	if json.Unmarshal(body, &v) != nil {
		return usage{}, false
	}
	return v.Usage.usage()
}

// chunk is what the proxy reads of one streamed event.
type chunk struct {
	Type    string `json:"type"` // Responses API events
	Delta   string `json:"delta"`
	Choices []struct {
		Index int `json:"index"`
		Delta struct {
			Content      string         `json:"content"`
			Refusal      string         `json:"refusal"`
			ToolCalls    []toolCallPart `json:"tool_calls"`
			FunctionCall *functionPart  `json:"function_call"` // the legacy functions API
		} `json:"delta"`
		Text string `json:"text"` // completions
	} `json:"choices"`
	Usage    *wireUsage `json:"usage"`
	Response *struct {
		Usage *wireUsage `json:"usage"`
	} `json:"response"`
}

// toolCallPart and functionPart are a streamed tool call's pieces: the
// model writes its name and arguments as output tokens.
type toolCallPart struct {
	Function *functionPart `json:"function"`
}

type functionPart struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

func (f *functionPart) writeTo(sb *strings.Builder) {
	if f != nil {
		sb.WriteString(f.Name)
		sb.WriteString(f.Arguments)
	}
}

// responsesOutputDeltas are the Responses API's streamed events whose
// delta is text the model wrote: its answer, a refusal, a function call's
// or a custom tool's input, and its reasoning text.
var responsesOutputDeltas = map[string]bool{
	"response.output_text.delta": true, "response.refusal.delta": true, "response.function_call_arguments.delta": true,
	"response.custom_tool_call_input.delta": true, "response.reasoning_text.delta": true, "response.reasoning_summary_text.delta": true,
}

// stream relays an SSE answer event by event, collecting what it streamed
// and the usage, and settles at its end: from the usage when the upstream
// sent it, else (the stream broke, or the client left) from the tokens
// streamed so far, counted with the model's encoding. A stream with usage
// is settled before its terminal event ([DONE], response.completed) is
// forwarded, so a client that saw its stream end sees the budget settled,
// as it does after a whole answer: its next call is not refused for a
// reservation the finished one still held.
func (c *call) stream(w http.ResponseWriter, resp *http.Response) {
	var streamed strings.Builder // every output the model wrote (text, refusals, tool calls), in order
	var got *usage
	settled := false
	relayEvents(w, resp, func(data []byte) bool {
		forward := c.read(data, &streamed, &got)
		if got != nil && !settled && c.terminal(data) {
			c.settle(*got)
			settled = true
		}
		return forward
	})
	if settled {
		return
	}
	if got != nil {
		c.settle(*got)
		return
	}
	// The stream ended without its usage: it broke, or the client left.
	// The prompt was read; the output is what was streamed.
	out := int64(0)
	if m, _ := c.p.estimator.Table().Lookup(c.est.Model); m.Encoding != "" {
		if n, err := estimator.CountText(m.Encoding, streamed.String()); err == nil {
			out = int64(n)
		}
	}
	c.settle(usage{input: c.est.InputTokens, output: out})
}

// terminal says whether an event's data ends the stream.
func (c *call) terminal(data []byte) bool {
	if c.kind != responses {
		return bytes.Equal(data, []byte("[DONE]"))
	}
	var ev struct {
		Type string `json:"type"`
	}
	if json.Unmarshal(data, &ev) != nil {
		return false
	}
	return ev.Type == "response.completed" || ev.Type == "response.incomplete" || ev.Type == "response.failed"
}

// read takes one event's data: it adds its text to streamed, records its
// usage, and says whether to forward it (not the usage chunk the proxy
// asked for on its own).
func (c *call) read(data []byte, streamed *strings.Builder, got **usage) bool {
	if len(data) == 0 || bytes.Equal(data, []byte("[DONE]")) {
		return true
	}
	var ch chunk
	if json.Unmarshal(data, &ch) != nil {
		return true
	}
	switch c.kind {
	case responses:
		if responsesOutputDeltas[ch.Type] {
			streamed.WriteString(ch.Delta)
		}
		if ch.Response != nil {
			if u, ok := ch.Response.Usage.usage(); ok {
				*got = &u
			}
		}
		return true
	default:
		for _, choice := range ch.Choices {
			streamed.WriteString(choice.Delta.Content)
			streamed.WriteString(choice.Delta.Refusal)
			for _, tc := range choice.Delta.ToolCalls {
				tc.Function.writeTo(streamed)
			}
			choice.Delta.FunctionCall.writeTo(streamed)
			streamed.WriteString(choice.Text)
		}
		if u, ok := ch.Usage.usage(); ok {
			*got = &u
			if c.stripUsage && len(ch.Choices) == 0 {
				return false
			}
		}
		return true
	}
}

// relayEvents relays an SSE answer to the client event by event, as each
// completes, after the upstream's status and headers. Each event's data
// (its data: lines joined) is shown to event first, which says whether the
// event goes on to the client; the caller settles from what event saw. It
// stops reading when the stream ends, whole or broken, or when the client
// is gone (the request's context then cancels the upstream call), and
// reports whether the client went away.
func relayEvents(w http.ResponseWriter, resp *http.Response, event func(data []byte) (forward bool)) (clientGone bool) {
	copyHeaders(w.Header(), resp.Header)
	w.WriteHeader(resp.StatusCode)
	flusher, _ := w.(http.Flusher)
	if flusher != nil {
		flusher.Flush()
	}
	rd := bufio.NewReaderSize(resp.Body, 64<<10)
	var raw, data bytes.Buffer
	for {
		line, err := rd.ReadBytes('\n')
		if len(line) > 0 {
			raw.Write(line)
			trimmed := bytes.TrimRight(line, "\r\n")
			if d, ok := bytes.CutPrefix(trimmed, []byte("data:")); ok {
				data.Write(bytes.TrimPrefix(d, []byte(" ")))
			}
			if len(trimmed) == 0 { // the event is complete
				if event(data.Bytes()) && !clientGone {
					if _, werr := w.Write(raw.Bytes()); werr != nil {
						clientGone = true
					} else if flusher != nil {
						flusher.Flush()
					}
				}
				raw.Reset()
				data.Reset()
				if clientGone {
					return true
				}
			}
		}
		if err != nil {
			return clientGone
		}
	}
}
