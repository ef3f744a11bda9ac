package proxy

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"

	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

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
	Usage *wireUsage `json:"usage"`
	// ServiceTier is the tier that served the stream, in every chunk of
	// Chat Completions and in the Responses API's response object.
	ServiceTier string `json:"service_tier"`
	Response    *struct {
		Usage       *wireUsage `json:"usage"`
		ServiceTier string     `json:"service_tier"`
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

// openAIStream reads an OpenAI stream: it collects what the model
// streamed and the usage, and its usage is final at the terminal event
// ([DONE], response.completed) once the usage came. A stream that ended
// without its usage (it broke, or the client left) is charged its prompt
// as estimated and the tokens streamed so far, counted with the model's
// encoding.
type openAIStream struct {
	rt       route
	est      estimator.Estimate
	out      outputCounter
	streamed strings.Builder // every output the model wrote (text, refusals, tool calls), in order
	got      *rule.Usage
}

func (openAI) framing(_ route, h http.Header) framing { return sseFraming(h) }

func (openAI) stream(rt route, est estimator.Estimate, out outputCounter) streamReader {
	return &openAIStream{rt: rt, est: est, out: out}
}

func (s *openAIStream) event(data []byte) (forward, final bool) {
	forward = s.read(data)
	return forward, s.got != nil && s.terminal(data)
}

func (s *openAIStream) usage() rule.Usage {
	if s.got != nil {
		return *s.got
	}
	return rule.Usage{Input: s.est.InputTokens, Output: s.out.CountOutput(s.est, s.streamed.String())}
}

// silent is false: an OpenAI stream that ended short is relayed as it
// ended.
func (s *openAIStream) silent() bool { return false }

// terminal says whether an event's data ends the stream.
func (s *openAIStream) terminal(data []byte) bool {
	if s.rt.api != responses {
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
func (s *openAIStream) read(data []byte) bool {
	if len(data) == 0 || bytes.Equal(data, []byte("[DONE]")) {
		return true
	}
	var ch chunk
	if json.Unmarshal(data, &ch) != nil {
		return true
	}
	streamed := &s.streamed
	switch s.rt.api {
	case responses:
		if responsesOutputDeltas[ch.Type] {
			streamed.WriteString(ch.Delta)
		}
		if ch.Response != nil {
			if u, ok := ch.Response.Usage.usage(); ok {
				u.Tier = estimator.ReadServiceTier(ch.Response.ServiceTier)
				s.got = &u
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
			u.Tier = estimator.ReadServiceTier(ch.ServiceTier)
			s.got = &u
			if s.rt.added && len(ch.Choices) == 0 {
				return false
			}
		}
		return true
	}
}
