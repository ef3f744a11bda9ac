package estimator_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/estimator"
)

var fuzzSeeds = []string{
	`{"model":"gpt-4o","messages":` + cookbookMessages + `}`,
	`{"model":"gpt-3.5-turbo-0301","messages":` + cookbookMessages + `}`,
	`{"model":"gpt-4","max_tokens":10,"tools":` + cookbookTools + `,"messages":` + cookbookToolMessages + `}`,
	`{"model":"gpt-4o-mini","n":3,"max_completion_tokens":50,"messages":[{"role":"user","content":[{"type":"text","text":"What's this?"},{"type":"image_url","image_url":{"url":"data:"}}]}]}`,
	`{"model":"gpt-4o","input_tokens":1200,"messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{}}]}]}`,
	`{"model":"gpt-4o","messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]},{"role":"tool","tool_call_id":"c","content":"ok"}]}`,
	`{"model":"o3","instructions":"Be terse.","input":[{"role":"user","content":"hi"},{"type":"function_call_output","call_id":"c","output":"42"}],"max_output_tokens":100}`,
	`{"model":"gpt-3.5-turbo","prompt":["a","b"],"max_tokens":7,"n":2}`,
	`{"model":"gpt-3.5-turbo","prompt":[[1,2,3],[4]]}`,
	`{"model":"text-embedding-3-small","input":[[1,2],[3]]}`,
	`{"model":"gpt-4o","messages":[{"role":"user","content":"a` + "\xff" + `"}]}`,
	`{"model":"gpt-4o","max_tokens":1.5,"messages":[]}`,
	`{"model":"x","messages":[{"role":"user","content":"<|endoftext|> I'M DON'T \u00a0\t\r\n  x"}],"max_tokens":1e3}`,
	`{"model":"gpt-4","messages":[{"role":"user","content":"` + strings.Repeat("a", 3000) + `"}]}`,
	`{"model":"gpt-4o","tools":[{"type":"function","function":{"name":"f","parameters":{"properties":{"a":{"type":"object","properties":{"b":{"enum":[1,"x",null]}}},"c":{"items":{"anyOf":[{"enum":["y"]}]}}}}}},{"type":"web_search"}],"messages":[{"role":"user","content":"q"}]}`,
	`[]`, `null`, `{}`, `{"model":"gpt-4o","messages":[{}]}`, `{"model":"gpt-4o","prompt":""}`,
}

func FuzzEstimate(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add([]byte(s))
	}
	est := estimator.New(nil)
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := estimator.Parse(body)
		if err != nil {
			checkInvalid(t, err)
			return
		}
		e, err := est.Estimate(r)
		if err != nil {
			checkInvalid(t, err)
			return
		}
		if e.InputTokens < 0 || e.OutputTokens < 1 || e.Cost != estimator.Cost(e.InputTokens, e.OutputTokens, e.InputWeightMicro, e.OutputWeightMicro) {
			t.Fatalf("inconsistent estimate %+v", e)
		}
		if again, err := est.Estimate(r); err != nil || again != e {
			t.Fatalf("estimate not deterministic: %+v then %+v, %v", e, again, err)
		}
		if r.Source() != "messages" {
			return
		}
		// Nothing dropped: every string content and text part of the
		// messages is in the count.
		enc := "o200k_base"
		if m, ok := est.Table().Lookup(r.Model()); ok {
			enc = m.Encoding
		}
		var sum int64
		for _, s := range messageTexts(t, body) {
			sum += count(t, enc, s)
		}
		if e.InputTokens < sum {
			t.Fatalf("InputTokens %d < %d, the count of the messages' text", e.InputTokens, sum)
		}
	})
}

func checkInvalid(t *testing.T, err error) {
	t.Helper()
	var ie *estimator.InvalidError
	if !errors.As(err, &ie) || !errors.Is(err, estimator.ErrInvalid) || ie.Field == "" || ie.Reason == "" {
		t.Fatalf("error %T %v is not a complete *InvalidError", err, err)
	}
}

// messageTexts extracts, independently of the package, each message's
// string content and the text of its text parts.
func messageTexts(t *testing.T, body []byte) []string {
	t.Helper()
	var req struct {
		Messages []map[string]any `json:"messages"`
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if err := dec.Decode(&req); err != nil {
		t.Fatalf("body accepted by Parse does not decode: %v", err)
	}
	var out []string
	for _, m := range req.Messages {
		switch c := m["content"].(type) {
		case string:
			out = append(out, c)
		case []any:
			for _, p := range c {
				part, _ := p.(map[string]any)
				switch part["type"] {
				case "text", "input_text", "output_text":
					if s, ok := part["text"].(string); ok {
						out = append(out, s)
					}
				}
			}
		}
	}
	return out
}
