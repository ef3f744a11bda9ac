package estimator_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"

	"github.com/tokengate/tokengate/estimator"
)

var defaultEstimator = estimator.New(nil)

func count(t testing.TB, enc, s string) int64 {
	t.Helper()
	n, err := estimator.CountText(enc, s)
	if err != nil {
		t.Fatal(err)
	}
	return int64(n)
}

func estimate(t testing.TB, body string) estimator.Estimate {
	t.Helper()
	r, err := estimator.Parse([]byte(body))
	if err != nil {
		t.Fatalf("Parse(%s): %v", body, err)
	}
	e, err := defaultEstimator.Estimate(r)
	if err != nil {
		t.Fatalf("Estimate(%s): %v", body, err)
	}
	return e
}

// estimateErr returns the InvalidError from parsing or estimating body.
func estimateErr(t testing.TB, body string) *estimator.InvalidError {
	t.Helper()
	r, err := estimator.Parse([]byte(body))
	if err == nil {
		_, err = defaultEstimator.Estimate(r)
	}
	if err == nil {
		t.Fatalf("%s: no error", body)
	}
	var ie *estimator.InvalidError
	if !errors.As(err, &ie) {
		t.Fatalf("%s: error %T %v is not an *InvalidError", body, err, err)
	}
	if !errors.Is(err, estimator.ErrInvalid) {
		t.Fatalf("%s: errors.Is(err, ErrInvalid) is false", body)
	}
	return ie
}

func TestCountTextKnownValues(t *testing.T) {
	t.Parallel()
	// Values published in OpenAI's cookbook ("How to count tokens with
	// tiktoken"), computed there with the Python tiktoken library.
	cases := []struct {
		s             string
		cl100k, o200k int
	}{
		{"", 0, 0},
		{"hello world", 2, 2},
		{"antidisestablishmentarianism", 6, 6},
		{"2 + 2 = 4", 7, 7},
		{"お誕生日おめでとう", 9, 8},
	}
	for _, c := range cases {
		t.Run(c.s, func(t *testing.T) {
			t.Parallel()
			if got := count(t, "cl100k_base", c.s); got != int64(c.cl100k) {
				t.Errorf("cl100k_base: %d, want %d", got, c.cl100k)
			}
			if got := count(t, "o200k_base", c.s); got != int64(c.o200k) {
				t.Errorf("o200k_base: %d, want %d", got, c.o200k)
			}
		})
	}
	if _, err := estimator.CountText("p50k_base", "x"); err == nil {
		t.Error("CountText with an unknown encoding succeeded")
	}
}

// cookbookMessages is the cookbook's example conversation.
const cookbookMessages = `[
 {"role": "system", "content": "You are a helpful, pattern-following assistant that translates corporate jargon into plain English."},
 {"role": "system", "name": "example_user", "content": "New synergies will help drive top-line growth."},
 {"role": "system", "name": "example_assistant", "content": "Things working well together will increase revenue."},
 {"role": "system", "name": "example_user", "content": "Let's circle back when we have more bandwidth to touch base on opportunities for increased leverage."},
 {"role": "system", "name": "example_assistant", "content": "Let's talk later when we're less busy about how to do better."},
 {"role": "user", "content": "This late pivot means we don't have time to boil the ocean for the client deliverable."}
]`

func TestCookbookConversation(t *testing.T) {
	t.Parallel()
	// The cookbook's published counts, which match the OpenAI API's
	// prompt_tokens: 129 for gpt-3.5-turbo and gpt-4 (cl100k_base), 124 for
	// gpt-4o and gpt-4o-mini (o200k_base), and 127 for gpt-3.5-turbo-0301
	// (4 tokens per message, -1 per name).
	cases := map[string]int64{
		"gpt-3.5-turbo": 129, "gpt-3.5-turbo-0125": 129, "gpt-3.5-turbo-0613": 129, "gpt-4-0613": 129, "gpt-4": 129,
		"gpt-4o": 124, "gpt-4o-mini": 124, "gpt-4o-2024-08-06": 124, "gpt-4o-mini-2024-07-18": 124,
		"gpt-3.5-turbo-0301": 127,
	}
	for model, want := range cases {
		t.Run(model, func(t *testing.T) {
			t.Parallel()
			e := estimate(t, `{"model":"`+model+`","max_tokens":1,"messages":`+cookbookMessages+`}`)
			if e.InputTokens != want {
				t.Errorf("InputTokens = %d, want %d", e.InputTokens, want)
			}
			if e.Approximate {
				t.Error("Approximate for a known model and text only")
			}
		})
	}
}

const cookbookTools = `[{"type": "function", "function": {
  "name": "get_current_weather",
  "description": "Get the current weather in a given location",
  "parameters": {"type": "object", "properties": {
    "location": {"type": "string", "description": "The city and state, e.g. San Francisco, CA"},
    "unit": {"type": "string", "description": "The unit of temperature to return", "enum": ["celsius", "fahrenheit"]}},
   "required": ["location"]}}}]`

const cookbookToolMessages = `[
 {"role": "system", "content": "You are a helpful assistant that can answer to questions about the weather."},
 {"role": "user", "content": "What's the weather like in San Francisco?"}]`

func TestCookbookTools(t *testing.T) {
	t.Parallel()
	// Published: 105 prompt tokens for gpt-3.5-turbo and gpt-4, 101 for
	// gpt-4o and gpt-4o-mini, equal to the API's prompt_tokens.
	for model, want := range map[string]int64{"gpt-3.5-turbo": 105, "gpt-4": 105, "gpt-4o": 101, "gpt-4o-mini": 101} {
		t.Run(model, func(t *testing.T) {
			t.Parallel()
			e := estimate(t, `{"model":"`+model+`","max_tokens":10,"tools":`+cookbookTools+`,"messages":`+cookbookToolMessages+`}`)
			if e.InputTokens != want {
				t.Errorf("InputTokens = %d, want %d", e.InputTokens, want)
			}
		})
	}
	// The same definition as a legacy function, as a Responses-style flat
	// tool, and with a trailing '.' on the description count the same.
	fn := `{"name": "get_current_weather", "description": "Get the current weather in a given location.",
	  "parameters": {"type": "object", "properties": {
	    "location": {"type": "string", "description": "The city and state, e.g. San Francisco, CA."},
	    "unit": {"type": "string", "description": "The unit of temperature to return", "enum": ["celsius", "fahrenheit"]}}}}`
	flat := `{"type":"function",` + strings.TrimPrefix(fn, "{")
	for _, body := range []string{
		`{"model":"gpt-4o","max_tokens":10,"functions":[` + fn + `],"messages":` + cookbookToolMessages + `}`,
		`{"model":"gpt-4o","max_tokens":10,"tools":[` + flat + `],"messages":` + cookbookToolMessages + `}`,
	} {
		if e := estimate(t, body); e.InputTokens != 101 {
			t.Errorf("%s: InputTokens = %d, want 101", body, e.InputTokens)
		}
	}
}

func TestToolsNestedAndEdgeCases(t *testing.T) {
	t.Parallel()
	const o = "o200k_base"
	msgs := `[{"role":"user","content":"hi"}]`
	base := 3 + count(t, o, "user") + count(t, o, "hi") + 3
	cases := []struct {
		name, tools string
		want        int64
		approx      bool
	}{
		{"no parameters", `[{"type":"function","function":{"name":"f"}}]`,
			7 + count(t, o, "f:") + 12, false},
		{"empty properties", `[{"type":"function","function":{"name":"f","description":"Does x.","parameters":{"type":"object","properties":{}}}}]`,
			7 + count(t, o, "f:Does x") + 12, false},
		{"missing type and description", `[{"type":"function","function":{"name":"f","parameters":{"properties":{"a":{}}}}}]`,
			7 + count(t, o, "f:") + 3 + 3 + count(t, o, "a::") + 12, false},
		{"nested object", `[{"type":"function","function":{"name":"f","parameters":{"properties":{
			"a":{"type":"object","description":"outer.","properties":{"b":{"type":"integer","description":"inner","enum":[1,2]}}}}}}}]`,
			7 + count(t, o, "f:") + 3 + 3 + count(t, o, "a:object:outer") + 3 + 3 + count(t, o, "b:integer:inner") - 3 + 3 + count(t, o, "1") + 3 + count(t, o, "2") + 12, false},
		{"array items", `[{"type":"function","function":{"name":"f","parameters":{"properties":{
			"a":{"type":"array","items":{"type":"string","enum":["x"]}}}}}}]`,
			7 + count(t, o, "f:") + 3 + 3 + count(t, o, "a:array:") - 3 + 3 + count(t, o, "x") + 12, false},
		{"type list", `[{"type":"function","function":{"name":"f","parameters":{"properties":{"a":{"type":["string","null"]}}}}}]`,
			7 + count(t, o, "f:") + 3 + 3 + count(t, o, "a:string | null:") + 12, false},
		{"two functions", `[{"type":"function","function":{"name":"f"}},{"type":"function","function":{"name":"g","description":"G"}}]`,
			7 + count(t, o, "f:") + 7 + count(t, o, "g:G") + 12, false},
		{"hosted tool only", `[{"type":"web_search"}]`, 0, true},
		{"empty list", `[]`, 0, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := estimate(t, `{"model":"gpt-4o","max_tokens":5,"messages":`+msgs+`,"tools":`+c.tools+`}`)
			if e.InputTokens != base+c.want {
				t.Errorf("InputTokens = %d, want %d", e.InputTokens, base+c.want)
			}
			if e.Approximate != c.approx {
				t.Errorf("Approximate = %v, want %v", e.Approximate, c.approx)
			}
		})
	}
}

func TestMessageRules(t *testing.T) {
	t.Parallel()
	const o, c = "o200k_base", "cl100k_base"
	cases := []struct {
		name, body string
		want       int64
	}{
		{"null content", `{"model":"gpt-4o","messages":[{"role":"assistant","content":null}]}`,
			3 + count(t, o, "assistant") + 3},
		{"tool call and tool result", `{"model":"gpt-4o","messages":[
			{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},
			{"role":"tool","tool_call_id":"call_1","content":"18C and sunny"}]}`,
			3 + count(t, o, "assistant") + count(t, o, "get_weather") + count(t, o, `{"city":"Paris"}`) +
				3 + count(t, o, "tool") + count(t, o, "call_1") + count(t, o, "18C and sunny") + 3},
		{"legacy function_call", `{"model":"gpt-4o","messages":[{"role":"assistant","function_call":{"name":"f","arguments":"{}"}}]}`,
			3 + count(t, o, "assistant") + count(t, o, "f") + count(t, o, "{}") + 3},
		{"name adds one", `{"model":"gpt-4","messages":[{"role":"user","name":"bob","content":"hi"}]}`,
			3 + count(t, c, "user") + count(t, c, "bob") + 1 + count(t, c, "hi") + 3},
		{"text parts", `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"text","text":"one"},{"type":"input_text","text":"two"},{"type":"output_text","text":"three"}]}]}`,
			3 + count(t, o, "user") + count(t, o, "one") + count(t, o, "two") + count(t, o, "three") + 3},
		{"other string fields", `{"model":"gpt-4o","messages":[{"role":"assistant","content":"a","refusal":"no way"}]}`,
			3 + count(t, o, "assistant") + count(t, o, "a") + count(t, o, "no way") + 3},
		{"special tokens are text", `{"model":"gpt-4o","messages":[{"role":"user","content":"<|endoftext|>"}]}`,
			3 + count(t, o, "user") + count(t, o, "<|endoftext|>") + 3},
		{"instructions", `{"model":"gpt-4o","instructions":"Be brief.","input":"Hello there"}`,
			count(t, o, "Be brief.") + count(t, o, "Hello there")},
		{"input strings", `{"model":"gpt-4o","input":["alpha","beta"]}`,
			count(t, o, "alpha") + count(t, o, "beta")},
		{"input messages", `{"model":"gpt-4o","input":[{"role":"user","content":"hi"},{"type":"message","role":"assistant","content":[{"type":"output_text","text":"hello"}]}]}`,
			3 + count(t, o, "user") + count(t, o, "hi") + 3 + count(t, o, "message") + count(t, o, "assistant") + count(t, o, "hello") + 3},
		{"input function items", `{"model":"gpt-4o","input":[{"type":"function_call_output","call_id":"c1","output":"42"}]}`,
			3 + count(t, o, "function_call_output") + count(t, o, "c1") + count(t, o, "42") + 3},
		{"input token ids", `{"model":"gpt-4o","input":[1,2,3]}`, 3},
		{"long input token array", `{"model":"gpt-4o","input":[` + strings.Repeat("1,", 12000) + `1]}`, 12001},
		{"input token arrays", `{"model":"gpt-4o","input":[[1,2],[3]]}`, 3},
		{"prompt string", `{"model":"gpt-3.5-turbo","prompt":"Say this is a test"}`, count(t, c, "Say this is a test")},
		{"empty prompt string", `{"model":"gpt-3.5-turbo","prompt":""}`, 0},
		{"prompt token ids", `{"model":"gpt-3.5-turbo","prompt":[1,2,3,4]}`, 4},
		{"prompt batch", `{"model":"gpt-3.5-turbo","prompt":["a b","c"]}`, count(t, c, "a b") + count(t, c, "c")},
		{"prompt token batch", `{"model":"gpt-3.5-turbo","prompt":[[1,2],[3]]}`, 3},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if e := estimate(t, tc.body); e.InputTokens != tc.want {
				t.Errorf("InputTokens = %d, want %d", e.InputTokens, tc.want)
			}
		})
	}
}

func TestPartsAndInputTokens(t *testing.T) {
	t.Parallel()
	const o = "o200k_base"
	text := 3 + count(t, o, "user") + count(t, o, "What is in this image?") + 3
	withParts := func(extra string) string {
		return `{"model":"gpt-4o","max_tokens":100` + extra + `,"messages":[{"role":"user","content":[
			{"type":"text","text":"What is in this image?"},
			{"type":"image_url","image_url":{"url":"https://example.com/a.png"}},
			{"type":"input_audio","input_audio":{"data":"AAAA","format":"wav"}}]}]}`
	}
	cases := []struct {
		name   string
		body   string
		want   int64
		approx bool
	}{
		{"defaults per part", withParts(""), text + 2*765, true},
		{"input_tokens raises", withParts(`,"input_tokens":5000`), 5000, false},
		{"input_tokens never lowers", withParts(`,"input_tokens":1`), text, false},
		{"input_tokens zero", withParts(`,"input_tokens":0`), text, false},
		{"unknown part type", `{"model":"gpt-4o","max_tokens":1,"messages":[{"role":"user","content":[{"type":"hologram"}]}]}`,
			3 + count(t, o, "user") + 3 + 765, true},
		{"responses parts", `{"model":"gpt-4o-mini","input":[{"role":"user","content":[{"type":"input_text","text":"hi"},{"type":"input_image","image_url":"x"},{"type":"input_file","file_id":"f"}]}]}`,
			3 + count(t, o, "user") + count(t, o, "hi") + 3 + 2*25501, true},
		{"text only input_tokens raise", `{"model":"gpt-4o","input_tokens":999,"messages":[{"role":"user","content":"hi"}]}`, 999, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := estimate(t, c.body)
			if e.InputTokens != c.want || e.Approximate != c.approx {
				t.Errorf("InputTokens, Approximate = %d, %v; want %d, %v", e.InputTokens, e.Approximate, c.want, c.approx)
			}
		})
	}
}

func TestOutputReservation(t *testing.T) {
	t.Parallel()
	msgs := `"messages":[{"role":"user","content":"hi"}]`
	in := 3 + count(t, "o200k_base", "user") + count(t, "o200k_base", "hi") + 3
	cases := []struct {
		name, body string
		want       int64
	}{
		{"default", `{"model":"gpt-4o",` + msgs + `}`, 16384},
		{"max_tokens", `{"model":"gpt-4o","max_tokens":100,` + msgs + `}`, 100},
		{"max_completion_tokens wins", `{"model":"gpt-4o","max_tokens":100,"max_completion_tokens":50,"max_output_tokens":70,` + msgs + `}`, 50},
		{"max_tokens before max_output_tokens", `{"model":"gpt-4o","max_tokens":100,"max_output_tokens":70,` + msgs + `}`, 100},
		{"max_output_tokens", `{"model":"o3","max_output_tokens":70,"input":"hi"}`, 70},
		{"null cap is absent", `{"model":"gpt-4o","max_tokens":null,` + msgs + `}`, 16384},
		{"integral float", `{"model":"gpt-4o","max_tokens":2.0e2,` + msgs + `}`, 200},
		{"n multiplies", `{"model":"gpt-4o","max_tokens":100,"n":3,` + msgs + `}`, 300},
		{"n multiplies default", `{"model":"gpt-4o","n":2,` + msgs + `}`, 2 * 16384},
		{"cap equal to limit", `{"model":"gpt-4o","max_tokens":16384,` + msgs + `}`, 16384},
		{"default clamped to window", `{"model":"gpt-4",` + msgs + `}`, 8192 - 8},
		{"prompt batch multiplies", `{"model":"gpt-3.5-turbo","max_tokens":10,"n":2,"prompt":["a","b","c"]}`, 60},
		{"unknown model accepts large cap", `{"model":"gpt-7","max_tokens":200000,` + msgs + `}`, 200000},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := estimate(t, c.body)
			if e.OutputTokens != c.want {
				t.Errorf("OutputTokens = %d, want %d", e.OutputTokens, c.want)
			}
		})
	}
	if in != 8 {
		t.Fatalf("the 'default clamped' case assumes 8 input tokens, have %d", in)
	}
}

func TestLookup(t *testing.T) {
	t.Parallel()
	tbl := estimator.DefaultTable()
	cases := map[string]string{
		"gpt-4o": "gpt-4o", "gpt-4o-2024-08-06": "gpt-4o", "gpt-4o-2024-05-13": "gpt-4o",
		"gpt-4o-mini": "gpt-4o-mini", "gpt-4o-mini-2024-07-18": "gpt-4o-mini",
		"gpt-4o-audio-preview-2024-12-17": "gpt-4o", "gpt-4o-mini-search-preview": "gpt-4o-mini",
		"gpt-4.1-2025-04-14": "gpt-4.1", "gpt-4.1-mini-2025-04-14": "gpt-4.1-mini", "gpt-4.1-nano-2025-04-14": "gpt-4.1-nano",
		"o1": "o1", "o1-2024-12-17": "o1", "o1-preview": "o1", "o1-preview-2024-09-12": "o1",
		"o3": "o3", "o3-2025-04-16": "o3", "o4-mini": "o4-mini", "o4-mini-2025-04-16": "o4-mini",
		"gpt-4-turbo": "gpt-4-turbo", "gpt-4-turbo-2024-04-09": "gpt-4-turbo", "gpt-4-turbo-preview": "gpt-4-turbo",
		"gpt-4-0125-preview": "gpt-4-turbo", "gpt-4-1106-preview": "gpt-4-turbo",
		"gpt-4": "gpt-4", "gpt-4-0613": "gpt-4", "gpt-4-0314": "gpt-4",
		"gpt-3.5-turbo": "gpt-3.5-turbo", "gpt-3.5-turbo-0125": "gpt-3.5-turbo", "gpt-3.5-turbo-0301": "gpt-3.5-turbo",
		"gpt-3.5-turbo-16k":      "gpt-3.5-turbo",
		"text-embedding-3-small": "text-embedding-3-small", "text-embedding-3-large": "text-embedding-3-large",
		"text-embedding-ada-002": "text-embedding-ada-002",
		// Claude: dated variants and aliases by the prefix rule.
		"claude-haiku-4-5-20251001": "claude-haiku-4-5", "claude-opus-4-5-20251101": "claude-opus-4-5",
		"claude-sonnet-4-5-20250929": "claude-sonnet-4-5", "claude-sonnet-4-20250514": "claude-sonnet-4",
		"claude-sonnet-4-0": "claude-sonnet-4", "claude-opus-4-1-20250805": "claude-opus-4-1",
		"claude-opus-5": "claude-opus-5", "claude-opus-5-5": "claude-opus-5-5", "claude-fable-5-2": "claude-fable-5-2",
		// Vertex AI's "@YYYYMMDD" and the "-latest" aliases are stripped.
		"claude-sonnet-4-5@20250929": "claude-sonnet-4-5", "claude-opus-4-1@20250805": "claude-opus-4-1",
		"claude-haiku-4-5-latest": "claude-haiku-4-5", "gpt-4o-latest": "gpt-4o", "claude-opus-4-5-20251101-latest": "claude-opus-4-5",
	}
	for name, fam := range cases {
		m, ok := tbl.Lookup(name)
		if !ok || m.Name != fam {
			t.Errorf("Lookup(%q) = %q, %v; want %q", name, m.Name, ok, fam)
		}
	}
	for _, name := range []string{"", "GPT-4o", "gpt-4o ", " gpt-4o", "gpt-4.5-preview", "gpt-40", "gpt-4x", "claude-3", "o1x", "chatgpt-4o-latest", "gpt", "-preview", "-0613", "-latest", "@20250929", "gpt-4o@20250929x", "gpt-4o@"} {
		if m, ok := tbl.Lookup(name); ok {
			t.Errorf("Lookup(%q) = %q, want unknown", name, m.Name)
		}
	}
	if _, ok := (*estimator.Table)(nil).Lookup("gpt-4o"); ok {
		t.Error("nil table knows gpt-4o")
	}

	ms := tbl.Models()
	if len(ms) != 46 {
		t.Fatalf("DefaultTable has %d models, want 46 (11 OpenAI chat, 3 OpenAI embedding, 21 Claude, 8 Gemini, 3 Gemini embedding)", len(ms))
	}
	for i, m := range ms {
		if i > 0 && ms[i-1].Name >= m.Name {
			t.Errorf("Models() not sorted: %q before %q", ms[i-1].Name, m.Name)
		}
		if m.InputWeightMicro != estimator.WeightOne || m.OutputWeightMicro != estimator.WeightOne {
			t.Errorf("%s weights %d/%d, want 1.0", m.Name, m.InputWeightMicro, m.OutputWeightMicro)
		}
		wantEnc := "o200k_base"
		if strings.HasPrefix(m.Name, "gpt-4-") || m.Name == "gpt-4" || m.Name == "gpt-3.5-turbo" || strings.HasPrefix(m.Name, "text-embedding-3") || m.Name == "text-embedding-ada-002" {
			wantEnc = "cl100k_base"
		}
		if m.Encoding != wantEnc {
			t.Errorf("%s encoding %s, want %s", m.Name, m.Encoding, wantEnc)
		}
	}
	gpt4, _ := tbl.Lookup("gpt-4")
	if gpt4.ContextWindow != 8192 || gpt4.DefaultOutputTokens != 8192 {
		t.Errorf("gpt-4 = %+v", gpt4)
	}
	for _, name := range []string{"text-embedding-3-small", "text-embedding-3-large", "text-embedding-ada-002"} {
		if m, _ := tbl.Lookup(name); m.ContextWindow != 8191 {
			t.Errorf("%s = %+v, want a context window of 8191", name, m)
		}
	}
	g41, _ := tbl.Lookup("gpt-4.1-nano")
	if g41.ContextWindow != 1047576 || g41.DefaultOutputTokens != 32768 {
		t.Errorf("gpt-4.1-nano = %+v", g41)
	}
}

func TestUnknownModelFallback(t *testing.T) {
	t.Parallel()
	e := estimate(t, `{"model":"my-finetune","messages":[{"role":"user","content":"hello world"}]}`)
	want := 3 + count(t, "o200k_base", "user") + count(t, "o200k_base", "hello world") + 3
	if e.Family != estimator.UnknownFamily || e.Model != "my-finetune" || !e.Approximate ||
		e.InputTokens != want || e.OutputTokens != 16384 ||
		e.InputWeightMicro != estimator.WeightOne || e.OutputWeightMicro != estimator.WeightOne ||
		e.Cost != want+16384 {
		t.Errorf("unknown model estimate = %+v (want input %d)", e, want)
	}
	// Parts of an unknown model use its 1000-token default.
	e = estimate(t, `{"model":"x","max_tokens":1,"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"u"}}]}]}`)
	if e.InputTokens != 3+1+3+1000 {
		t.Errorf("unknown model part: InputTokens = %d", e.InputTokens)
	}
}

func TestKnownEstimateFields(t *testing.T) {
	t.Parallel()
	e := estimate(t, `{"model":"gpt-4o-2024-08-06","max_tokens":10,"max_wait_ms":250,"temperature":0.2,"stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	if e.Model != "gpt-4o-2024-08-06" || e.Family != "gpt-4o" || e.Approximate || e.OutputTokens != 10 ||
		e.Cost != e.InputTokens+10 {
		t.Errorf("estimate = %+v", e)
	}
	r, err := estimator.Parse([]byte(`{"model":"gpt-4o","max_wait_ms":250,"input_tokens":7,"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if r.Model() != "gpt-4o" || r.MaxWaitMS() != 250 || r.Source() != "messages" {
		t.Errorf("accessors: %q %d %q", r.Model(), r.MaxWaitMS(), r.Source())
	}
	if n, ok := r.InputTokens(); n != 7 || !ok {
		t.Errorf("InputTokens() = %d, %v", n, ok)
	}
	r, _ = estimator.Parse([]byte(`{"model":"gpt-4o","prompt":"x"}`))
	if r.MaxWaitMS() != 0 {
		t.Errorf("absent max_wait_ms = %d", r.MaxWaitMS())
	}
}

func TestCost(t *testing.T) {
	t.Parallel()
	const max = math.MaxInt64
	cases := []struct {
		in, out, inW, outW, want int64
	}{
		{0, 0, 1_000_000, 1_000_000, 0},
		{100, 50, 1_000_000, 1_000_000, 150},
		{1, 0, 1, 1, 1},                    // 1e-6 rounds up to 1
		{3, 0, 333_333, 1, 1},              // 0.999999 -> 1
		{3, 0, 333_334, 1, 2},              // 1.000002 -> 2
		{10, 10, 1_500_000, 2_250_000, 38}, // 15 + 22.5 = 37.5 -> 38
		{7, 3, 250_000, 500_000, 4},        // 1.75 + 1.5 = 3.25 -> 4
		{1_000_000, 0, 1_234_567, 1, 1_234_567},
		{1_000_000_000, 1_000_000_000, 1_000_000_000, 1_000_000_000, 2_000_000_000_000},
		{max, max, 1_000_000_000, 1_000_000_000, max}, // saturates
		{max, 0, 1_000_000, 1, max},
		{-5, 10, 1_000_000, 1_000_000, 10}, // negatives count as 0
	}
	for _, c := range cases {
		if got := estimator.Cost(c.in, c.out, c.inW, c.outW); got != c.want {
			t.Errorf("Cost(%d, %d, %d, %d) = %d, want %d", c.in, c.out, c.inW, c.outW, got, c.want)
		}
	}
	// Exhaustive check of the rounding on small values.
	for in := int64(0); in < 40; in++ {
		for w := int64(1); w < 3_000_000; w += 77_777 {
			num := in * w
			want := num / 1_000_000
			if num%1_000_000 != 0 {
				want++
			}
			if got := estimator.Cost(in, 0, w, 1); got != want {
				t.Fatalf("Cost(%d, 0, %d, 1) = %d, want %d", in, w, got, want)
			}
		}
	}
}

func TestCustomTableWeights(t *testing.T) {
	t.Parallel()
	tbl, err := estimator.NewTable([]estimator.Model{{
		Name: "cheap", Encoding: "cl100k_base", InputWeightMicro: 250_000, OutputWeightMicro: 1_500_000,
		DefaultOutputTokens: 100, ContextWindow: 1000, PartTokens: 10,
	}})
	if err != nil {
		t.Fatal(err)
	}
	est := estimator.New(&estimator.Config{Table: tbl})
	if est.Table() != tbl {
		t.Error("Table() is not the configured table")
	}
	r, err := estimator.Parse([]byte(`{"model":"cheap-2024-01-01","max_tokens":3,"prompt":"hello world"}`))
	if err != nil {
		t.Fatal(err)
	}
	e, err := est.Estimate(r)
	if err != nil {
		t.Fatal(err)
	}
	// 2 input tokens * 0.25 + 3 output * 1.5 = 5.0
	if e.InputTokens != 2 || e.OutputTokens != 3 || e.Cost != 5 || e.Family != "cheap" ||
		e.InputWeightMicro != 250_000 || e.OutputWeightMicro != 1_500_000 {
		t.Errorf("estimate = %+v", e)
	}
	if estimator.New(&estimator.Config{}).Table() == nil {
		t.Error("empty Config has no table")
	}

	bad := []estimator.Model{
		{Encoding: "o200k_base", InputWeightMicro: 1, OutputWeightMicro: 1, DefaultOutputTokens: 1, ContextWindow: 1, PartTokens: 1},
		{Name: "a", Encoding: "p50k_base", InputWeightMicro: 1, OutputWeightMicro: 1, DefaultOutputTokens: 1, ContextWindow: 1, PartTokens: 1},
		{Name: "a", Encoding: "o200k_base", InputWeightMicro: 0, OutputWeightMicro: 1, DefaultOutputTokens: 1, ContextWindow: 1, PartTokens: 1},
		{Name: "a", Encoding: "o200k_base", InputWeightMicro: 1, OutputWeightMicro: -1, DefaultOutputTokens: 1, ContextWindow: 1, PartTokens: 1},
		{Name: "a", Encoding: "o200k_base", InputWeightMicro: 1, OutputWeightMicro: 1, DefaultOutputTokens: 0, ContextWindow: 1, PartTokens: 1},
		{Name: "a", Encoding: "o200k_base", InputWeightMicro: 1, OutputWeightMicro: 1, DefaultOutputTokens: 1, ContextWindow: 0, PartTokens: 1},
		{Name: "a", Encoding: "o200k_base", InputWeightMicro: 1, OutputWeightMicro: 1, DefaultOutputTokens: 1, ContextWindow: 1, PartTokens: 0},
	}
	for i, m := range bad {
		if _, err := estimator.NewTable([]estimator.Model{m}); err == nil {
			t.Errorf("bad model %d accepted", i)
		}
	}
	if _, err := estimator.NewTable(nil); err == nil {
		t.Error("empty table accepted")
	}
	dup := estimator.DefaultTable().Models()
	if _, err := estimator.NewTable(append(dup, dup[0])); err == nil {
		t.Error("duplicate name accepted")
	}
}

func TestInvalidRequests(t *testing.T) {
	t.Parallel()
	msgs := `"messages":[{"role":"user","content":"hi"}]`
	ok := `{"model":"gpt-4o",` + msgs
	many := `[` + strings.Repeat(`{"role":"user","content":"x"},`, estimator.MaxMessages) + `{"role":"user","content":"x"}]`
	cases := []struct {
		name, body, field, reason string
	}{
		{"empty", ``, "body", "is empty"},
		{"not json", `hello`, "body", "byte offset"},
		{"truncated", `{"model":"gpt-4o"`, "body", "byte offset"},
		{"array body", `[1,2]`, "body", "must be a JSON object"},
		{"null body", `null`, "body", "must be a JSON object"},
		{"trailing data", ok + `} {}`, "body", "byte offset"},
		{"bad utf8 in content", `{"model":"gpt-4o","messages":[{"role":"user","content":"a` + "\xff" + `b"}]}`, "messages[0].content", "invalid UTF-8"},
		{"bad utf8 in part", `{"model":"gpt-4o","messages":[{"role":"user","content":"x"},{"role":"user","content":[{"type":"text","text":"ok"},{"type":"text","text":"` + "\xc3" + `"}]}]}`, "messages[1].content[1].text", "invalid UTF-8"},
		{"bad utf8 in model", `{"model":"gpt-4o` + "\xfe" + `",` + msgs + `}`, "model", "invalid UTF-8"},
		{"bad utf8 in key", `{"model":"gpt-4o","messages":[{"role":"user","c` + "\x80" + `":"x"}]}`, "messages[0]", "invalid UTF-8"},
		{"bad utf8 in top key", `{"m` + "\x80" + `":1}`, "body", "invalid UTF-8"},
		{"bad utf8 outside string", `{"model":` + "\x80" + `}`, "body", "invalid UTF-8"},
		{"missing model", `{` + msgs + `}`, "model", "is required"},
		{"null model", `{"model":null,` + msgs + `}`, "model", "is required"},
		{"model type", `{"model":4,` + msgs + `}`, "model", "must be a string"},
		{"model empty", `{"model":"",` + msgs + `}`, "model", "must not be empty"},
		{"model with a NUL", `{"model":"gpt-4o\u0000",` + msgs + `}`, "model", "must not contain a NUL"},
		{"model too long", `{"model":"` + strings.Repeat("m", 257) + `",` + msgs + `}`, "model", "at most 256"},
		{"max_tokens string", ok + `,"max_tokens":"10"}`, "max_tokens", "must be an integer"},
		{"max_tokens fraction", ok + `,"max_tokens":1.5}`, "max_tokens", "must be an integer"},
		{"max_tokens tiny fraction", ok + `,"max_tokens":1.0000000000000000001}`, "max_tokens", "must be an integer"},
		{"max_tokens zero", ok + `,"max_tokens":0}`, "max_tokens", "must be at least 1"},
		{"max_tokens negative", ok + `,"max_tokens":-3}`, "max_tokens", "must be at least 1"},
		{"max_tokens huge", ok + `,"max_tokens":1e10}`, "max_tokens", "at most 1000000000"},
		{"max_tokens enormous", ok + `,"max_tokens":1e999999999}`, "max_tokens", "at most"},
		{"max_tokens very negative", ok + `,"max_tokens":-1e40}`, "max_tokens", "at least 1"},
		{"max_tokens over model limit", ok + `,"max_tokens":16385}`, "max_tokens", "exceeds the model's output limit of 16384"},
		{"max_completion_tokens zero", ok + `,"max_completion_tokens":0}`, "max_completion_tokens", "must be at least 1"},
		{"max_completion_tokens over limit", `{"model":"gpt-4-0613",` + msgs + `,"max_completion_tokens":8193}`, "max_completion_tokens", "exceeds the model's output limit of 8192"},
		{"lower-precedence cap over limit", ok + `,"max_completion_tokens":10,"max_tokens":20000}`, "max_tokens", "output limit"},
		{"max_output_tokens bool", `{"model":"o3","input":"x","max_output_tokens":true}`, "max_output_tokens", "must be an integer"},
		{"max_output_tokens over limit", `{"model":"o3","input":"x","max_output_tokens":100001}`, "max_output_tokens", "output limit of 100000"},
		{"n zero", ok + `,"n":0}`, "n", "at least 1"},
		{"n too big", ok + `,"n":129}`, "n", "at most 128"},
		{"n fraction", ok + `,"n":2.5}`, "n", "must be an integer"},
		{"n string", ok + `,"n":"2"}`, "n", "must be an integer"},
		{"max_wait_ms negative", ok + `,"max_wait_ms":-1}`, "max_wait_ms", "at least 0"},
		{"max_wait_ms too big", ok + `,"max_wait_ms":3600001}`, "max_wait_ms", "at most 3600000"},
		{"max_wait_ms type", ok + `,"max_wait_ms":[1]}`, "max_wait_ms", "must be an integer"},
		{"input_tokens negative", ok + `,"input_tokens":-1}`, "input_tokens", "at least 0"},
		{"input_tokens too big", ok + `,"input_tokens":100000001}`, "input_tokens", "at most 100000000"},
		{"input_tokens type", ok + `,"input_tokens":"5"}`, "input_tokens", "must be an integer"},
		{"no input", `{"model":"gpt-4o"}`, "messages", "required"},
		{"null messages", `{"model":"gpt-4o","messages":null}`, "messages", "required"},
		{"messages empty", `{"model":"gpt-4o","messages":[]}`, "messages", "must not be empty"},
		{"messages object", `{"model":"gpt-4o","messages":{}}`, "messages", "must be an array"},
		{"too many messages", `{"model":"gpt-4o","messages":` + many + `}`, "messages", "at most 10000"},
		{"message not object", `{"model":"gpt-4o","messages":["hi"]}`, "messages[0]", "must be an object"},
		{"role missing", `{"model":"gpt-4o","messages":[{"content":"hi"}]}`, "messages[0].role", "is required"},
		{"role type", `{"model":"gpt-4o","messages":[{"role":"user","content":"a"},{"role":"user","content":"b"},{"role":7,"content":"c"}]}`, "messages[2].role", "must be a string"},
		{"role unknown", `{"model":"gpt-4o","messages":[{"role":"bot","content":"hi"}]}`, "messages[0].role", "must be one of"},
		{"role case", `{"model":"gpt-4o","messages":[{"role":"User","content":"hi"}]}`, "messages[0].role", "must be one of"},
		{"content number", `{"model":"gpt-4o","messages":[{"role":"user","content":5}]}`, "messages[0].content", "must be a string, an array"},
		{"content object", `{"model":"gpt-4o","messages":[{"role":"user","content":{"type":"text"}}]}`, "messages[0].content", "must be a string, an array"},
		{"part not object", `{"model":"gpt-4o","messages":[{"role":"user","content":["x"]}]}`, "messages[0].content[0]", "must be an object"},
		{"part type missing", `{"model":"gpt-4o","messages":[{"role":"user","content":[{"text":"x"}]}]}`, "messages[0].content[0].type", "is required"},
		{"part type number", `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":1}]}]}`, "messages[0].content[0].type", "must be a string"},
		{"text part without text", `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"text"}]}]}`, "messages[0].content[0].text", "is required"},
		{"text part text number", `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"input_text","text":5}]}]}`, "messages[0].content[1].text", "must be a string"},
		{"name type", `{"model":"gpt-4o","messages":[{"role":"user","name":5,"content":"x"}]}`, "messages[0].name", "must be a string"},
		{"tool_call_id type", `{"model":"gpt-4o","messages":[{"role":"tool","tool_call_id":{},"content":"x"}]}`, "messages[0].tool_call_id", "must be a string"},
		{"tool_calls type", `{"model":"gpt-4o","messages":[{"role":"assistant","tool_calls":"x"}]}`, "messages[0].tool_calls", "must be an array"},
		{"tool_call not object", `{"model":"gpt-4o","messages":[{"role":"assistant","tool_calls":[1]}]}`, "messages[0].tool_calls[0]", "must be an object"},
		{"tool_call function type", `{"model":"gpt-4o","messages":[{"role":"assistant","tool_calls":[{"function":"f"}]}]}`, "messages[0].tool_calls[0].function", "must be an object"},
		{"tool_call arguments type", `{"model":"gpt-4o","messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":{}}}]}]}`, "messages[0].tool_calls[0].function.arguments", "must be a string"},
		{"function_call name type", `{"model":"gpt-4o","messages":[{"role":"assistant","function_call":{"name":1}}]}`, "messages[0].function_call.name", "must be a string"},
		{"messages and prompt", `{"model":"gpt-4o",` + msgs + `,"prompt":"x"}`, "prompt", "cannot be combined with messages"},
		{"prompt and input", `{"model":"gpt-4o","prompt":"x","input":"y"}`, "input", "cannot be combined with prompt"},
		{"prompt empty", `{"model":"gpt-4o","prompt":[]}`, "prompt", "must not be empty"},
		{"prompt number", `{"model":"gpt-4o","prompt":5}`, "prompt", "must be a string or an array"},
		{"prompt mixed", `{"model":"gpt-4o","prompt":["a",1]}`, "prompt[1]", "must be a string"},
		{"prompt bool", `{"model":"gpt-4o","prompt":[true]}`, "prompt[0]", "must be a string, a token id"},
		{"prompt negative token", `{"model":"gpt-4o","prompt":[1,-1]}`, "prompt[1]", "token id"},
		{"prompt fractional token", `{"model":"gpt-4o","prompt":[1.5]}`, "prompt[0]", "token id"},
		{"prompt token mixed", `{"model":"gpt-4o","prompt":[1,"a"]}`, "prompt[1]", "token id"},
		{"prompt empty token array", `{"model":"gpt-4o","prompt":[[1],[]]}`, "prompt[1]", "must not be empty"},
		{"prompt token array mixed", `{"model":"gpt-4o","prompt":[[1],2]}`, "prompt[1]", "array of token ids"},
		{"prompt nested token", `{"model":"gpt-4o","prompt":[[1,[2]]]}`, "prompt[0][1]", "token id"},
		{"too many input items", `{"model":"gpt-4o","input":[` + strings.Repeat(`"x",`, estimator.MaxMessages) + `"x"]}`, "input", "at most 10000"},
		{"deep nesting", `{"model":"gpt-4o","metadata":` + strings.Repeat("[", 20000) + strings.Repeat("]", 20000) + `,"prompt":"x"}`, "body", "invalid JSON"},
		{"deep nesting bad utf8", `{"model":"gpt-4o","metadata":` + strings.Repeat("[", 20000) + `"` + "\xff" + `"` + strings.Repeat("]", 20000) + `}`, "body", "invalid UTF-8"},
		{"input empty", `{"model":"gpt-4o","input":[]}`, "input", "must not be empty"},
		{"input object", `{"model":"gpt-4o","input":{}}`, "input", "must be a string or an array"},
		{"input bool item", `{"model":"gpt-4o","input":["a",true]}`, "input[1]", "must be a string or an object"},
		{"input item without role or type", `{"model":"gpt-4o","input":[{"content":"x"}]}`, "input[0]", "must have a role or a type"},
		{"input item type number", `{"model":"gpt-4o","input":[{"type":3}]}`, "input[0].type", "must be a string"},
		{"input message without role", `{"model":"gpt-4o","input":[{"type":"message","content":"x"}]}`, "input[0].role", "is required"},
		{"input message bad part", `{"model":"gpt-4o","input":[{"role":"user","content":[{"type":"input_text"}]}]}`, "input[0].content[0].text", "is required"},
		{"input token mixed", `{"model":"gpt-4o","input":[1,"a"]}`, "input[1]", "token id"},
		{"instructions type", `{"model":"gpt-4o","input":"x","instructions":5}`, "instructions", "must be a string"},
		{"tools type", ok + `,"tools":{}}`, "tools", "must be an array"},
		{"tool not object", ok + `,"tools":[1]}`, "tools[0]", "must be an object"},
		{"tool type number", ok + `,"tools":[{"type":1}]}`, "tools[0].type", "must be a string"},
		{"tool function type", ok + `,"tools":[{"type":"function","function":[]}]}`, "tools[0].function", "must be an object"},
		{"tool name missing", ok + `,"tools":[{"type":"function","function":{"description":"d"}}]}`, "tools[0].function.name", "is required"},
		{"flat tool name missing", ok + `,"tools":[{"type":"function","description":"d"}]}`, "tools[0].name", "is required"},
		{"tool description type", ok + `,"tools":[{"type":"function","function":{"name":"f","description":1}}]}`, "tools[0].function.description", "must be a string"},
		{"tool parameters type", ok + `,"tools":[{"type":"function","function":{"name":"f","parameters":"x"}}]}`, "tools[0].function.parameters", "must be an object"},
		{"functions description type", ok + `,"functions":[{"name":"f","description":5}]}`, "functions[0].description", "must be a string"},
		{"context window", `{"model":"gpt-4","max_tokens":8000,"messages":[{"role":"user","content":"` + strings.Repeat("hello ", 300) + `"}]}`, "messages", "exceeds the model's context window of 8192 tokens"},
		{"context window no room", `{"model":"gpt-4","input_tokens":8192,"messages":[{"role":"user","content":"x"}]}`, "messages", "context window of 8192 tokens"},
		{"context window prompt", `{"model":"gpt-3.5-turbo","max_tokens":4096,"prompt":"` + strings.Repeat("hello ", 13000) + `"}`, "prompt", "context window of 16385 tokens"},
		{"context window input", `{"model":"gpt-4o","input_tokens":120000,"max_output_tokens":10000,"input":"x"}`, "input", "context window of 128000 tokens"},
		{"context window batch prompt", `{"model":"gpt-4","max_tokens":4000,"prompt":[[` + strings.Repeat("1,", 4200) + `1]]}`, "prompt", "context window"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := estimateErr(t, c.body)
			if e.Field != c.field || !strings.Contains(e.Reason, c.reason) {
				t.Errorf("got %q: %q; want %q: ...%q...", e.Field, e.Reason, c.field, c.reason)
			}
			if !strings.Contains(e.Error(), e.Field) || !strings.Contains(e.Error(), e.Reason) {
				t.Errorf("Error() = %q", e.Error())
			}
		})
	}
}

func TestAcceptedEdgeCases(t *testing.T) {
	t.Parallel()
	if _, err := estimator.Parse([]byte(`{"model":"gpt-4o","input_tokens":100000000,"max_wait_ms":3600000,"input":"x"}`)); err != nil {
		t.Errorf("limits rejected: %v", err)
	}
	for _, body := range []string{
		`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"temperature":0.7,"stream":true,"user":"u1","metadata":{"a":[1,2]}}`,
		`{"model":"gpt-4o","n":null,"max_tokens":null,"max_wait_ms":null,"input_tokens":null,"tools":null,"functions":null,"instructions":null,"prompt":null,"messages":[{"role":"developer","content":[]}]}`,
		`{"model":"gpt-4.1","max_wait_ms":3600000,"input_tokens":1000000,"max_tokens":1,"input":"x"}`,
		`{"model":"gpt-4o","n":128,"max_tokens":1e0,"messages":[{"role":"function","name":"f","content":"x"}]}`,
		`{"model":"gpt-4o","messages":[{"role":"user","content":"` + strings.Repeat("x", 1000) + `"}]}` + " \n\t",
		` {"model":"` + strings.Repeat("m", 256) + `","prompt":[0]}`,
		`{"model":"gpt-4o","model":"gpt-4","messages":[{"role":"user","content":"dup key: last wins"}]}`,
	} {
		if _, err := estimator.Parse([]byte(body)); err != nil {
			t.Errorf("Parse(%.80s): %v", body, err)
			continue
		}
		_ = estimate(t, body)
	}
}

func TestNilAndZeroValues(t *testing.T) {
	t.Parallel()
	var r *estimator.Request
	if r.Model() != "" || r.MaxWaitMS() != 0 || r.Source() != "" {
		t.Error("nil Request accessors")
	}
	if _, err := defaultEstimator.Estimate(nil); !errors.Is(err, estimator.ErrInvalid) {
		t.Errorf("Estimate(nil) = %v", err)
	}
	if _, err := defaultEstimator.Estimate(&estimator.Request{}); err == nil {
		t.Error("Estimate of a zero Request succeeded")
	}
	var zero estimator.Estimator
	if _, err := zero.Estimate(&estimator.Request{}); err == nil {
		t.Error("zero Estimator estimated a zero Request")
	}
	if (*estimator.Table)(nil).Models() != nil {
		t.Error("nil table has models")
	}
}

func TestConcurrentEstimates(t *testing.T) {
	t.Parallel()
	bodies := []string{
		`{"model":"gpt-4o","messages":` + cookbookMessages + `}`,
		`{"model":"gpt-4","max_tokens":10,"messages":` + cookbookMessages + `}`,
		`{"model":"gpt-4o-mini","tools":` + cookbookTools + `,"messages":` + cookbookToolMessages + `}`,
		`{"model":"o3","input":[{"role":"user","content":[{"type":"input_text","text":"Describe"},{"type":"input_image","image_url":"x"}]}]}`,
		`{"model":"gpt-3.5-turbo","prompt":["one","two","three"],"max_tokens":5}`,
		`{"model":"unknown-model","messages":[{"role":"user","content":"` + strings.Repeat("héllo wörld 123 ", 50) + `"}]}`,
	}
	reqs := make([]*estimator.Request, len(bodies))
	want := make([]estimator.Estimate, len(bodies))
	for i, b := range bodies {
		r, err := estimator.Parse([]byte(b))
		if err != nil {
			t.Fatal(err)
		}
		reqs[i] = r
	}
	// A fresh estimator per goroutine group and a shared one: the encoders
	// are process-wide and must be shared safely.
	shared := estimator.New(nil)
	var wg sync.WaitGroup
	results := make([][]estimator.Estimate, 50)
	errs := make(chan error, 50)
	for g := 0; g < 50; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			est := shared
			if g%2 == 1 {
				est = estimator.New(&estimator.Config{})
			}
			for rep := 0; rep < 5; rep++ {
				for i := range reqs {
					// Parse concurrently too.
					r, err := estimator.Parse([]byte(bodies[(i+g)%len(bodies)]))
					if err != nil {
						errs <- err
						return
					}
					if _, err := est.Estimate(r); err != nil {
						errs <- err
						return
					}
				}
			}
			var out []estimator.Estimate
			for _, r := range reqs {
				e, err := est.Estimate(r)
				if err != nil {
					errs <- err
					return
				}
				out = append(out, e)
			}
			results[g] = out
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for i, r := range reqs {
		e, err := shared.Estimate(r)
		if err != nil {
			t.Fatal(err)
		}
		want[i] = e
	}
	for g, out := range results {
		for i := range out {
			if out[i] != want[i] {
				t.Fatalf("goroutine %d request %d: %+v, want %+v", g, i, out[i], want[i])
			}
		}
	}
}

func ExampleEstimator_Estimate() {
	r, err := estimator.Parse([]byte(`{"model":"gpt-4o-2024-08-06","max_tokens":100,"n":2,
		"messages":[{"role":"user","content":"hello world"}]}`))
	if err != nil {
		fmt.Println(err)
		return
	}
	e, err := estimator.New(nil).Estimate(r)
	if err != nil {
		fmt.Println(err)
		return
	}
	b, _ := json.Marshal(e)
	fmt.Println(string(b))
	// Output:
	// {"Model":"gpt-4o-2024-08-06","Family":"gpt-4o","InputTokens":9,"OutputTokens":200,"Cost":209,"Approximate":false,"InputWeightMicro":1000000,"OutputWeightMicro":1000000}
}

// TestEffectiveInputOfCachedTokens: cached input tokens count at the
// model's cached-input weight, as input tokens at its input weight, rounded
// up; without a cached weight they count as any input token.
func TestEffectiveInputOfCachedTokens(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		input, cached     int64
		in, cachedW, want int64
	}{
		{1000, 800, estimator.WeightOne, 0, 1000},                       // no cached weight
		{1000, 800, estimator.WeightOne, estimator.WeightOne / 10, 280}, // 200 + 80
		{1000, 800, 2 * estimator.WeightOne, estimator.WeightOne, 600},  // 200 + 400
		{1000, 3, estimator.WeightOne, estimator.WeightOne / 10, 998},   // 997 + ceil(0.3)
		{1000, 5000, estimator.WeightOne, estimator.WeightOne / 2, 500}, // cached clamped to the input
		{1000, -5, estimator.WeightOne, estimator.WeightOne / 2, 1000},  // nonsense ignored
	} {
		m := estimator.Model{InputWeightMicro: c.in, CachedInputWeightMicro: c.cachedW}
		if got := m.EffectiveInput(c.input, c.cached); got != c.want {
			t.Errorf("%d input, %d cached, weights %d/%d: %d, want %d", c.input, c.cached, c.in, c.cachedW, got, c.want)
		}
	}
}
