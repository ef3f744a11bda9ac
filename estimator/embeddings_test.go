package estimator_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/estimator"
)

// embeddingsEstimate parses body as an embeddings call and estimates it.
func embeddingsEstimate(t testing.TB, body string) (estimator.Estimate, error) {
	t.Helper()
	r, err := estimator.ParseEmbeddings([]byte(body))
	if err != nil {
		return estimator.Estimate{}, err
	}
	if r.Source() != "input" {
		t.Fatalf("Source() = %q, want input", r.Source())
	}
	return defaultEstimator.Estimate(r)
}

// TestEmbeddingsExactInputNoOutput: every input shape is counted exactly
// with the model's encoding (cl100k_base for the embedding models), token
// ids one each, and no output is reserved.
func TestEmbeddingsExactInputNoOutput(t *testing.T) {
	t.Parallel()
	cl := func(s string) int64 { return count(t, estimator.EncodingCL100K, s) }
	o2 := func(s string) int64 { return count(t, estimator.EncodingO200K, s) }
	long := strings.Repeat("tokengate admits requests by their cost. ", 600)
	cases := []struct {
		name, body string
		in         int64
		approx     bool
	}{
		{"string", `{"model":"text-embedding-3-small","input":"The food was delicious and the waiter..."}`,
			cl("The food was delicious and the waiter..."), false},
		{"strings", `{"model":"text-embedding-3-large","input":["hello world","お誕生日おめでとう","2 + 2 = 4"]}`,
			cl("hello world") + cl("お誕生日おめでとう") + cl("2 + 2 = 4"), false},
		{"token ids", `{"model":"text-embedding-ada-002","input":[1,2,3,4,5]}`, 5, false},
		{"token arrays", `{"model":"text-embedding-3-small","input":[[1,2],[3],[4,5,6,7]]}`, 7, false},
		{"pass-through fields", `{"model":"text-embedding-3-small","input":"hi","dimensions":256,"encoding_format":"base64","user":"u-1","max_wait_ms":500}`,
			cl("hi"), false},
		{"null optional fields", `{"model":"text-embedding-3-small","input":"hi","dimensions":null,"encoding_format":null,"user":null}`,
			cl("hi"), false},
		{"dated variant", `{"model":"text-embedding-3-small-2024-01-25","input":"hi"}`, cl("hi"), false},
		{"unknown model: o200k, approximate", `{"model":"my-embedder","input":"hello embeddings"}`, o2("hello embeddings"), true},
		// Each input is held to the window on its own: together they may
		// exceed it, as the provider allows.
		{"batch beyond one window", `{"model":"text-embedding-3-small","input":["` + long + `","` + long + `","` + long + `"]}`,
			3 * cl(long), false},
		{"tools and prompts are not embeddings' fields", `{"model":"text-embedding-3-small","input":"hi","max_tokens":5,"tools":7,"messages":3}`,
			cl("hi"), false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e, err := embeddingsEstimate(t, c.body)
			if err != nil {
				t.Fatal(err)
			}
			if e.InputTokens != c.in || e.OutputTokens != 0 || e.Cost != c.in || e.Approximate != c.approx {
				t.Fatalf("estimate %+v, want %d input tokens, no output, cost %d, approximate %v", e, c.in, c.in, c.approx)
			}
		})
	}
	if 3*cl(long) <= 8191 || cl(long) > 8191 {
		t.Fatalf("the batch case needs an input under 8191 tokens (%d) whose triple is over", cl(long))
	}
}

// TestEmbeddingsWeights: an embedding model's input weight prices its
// input; its output weight never applies.
func TestEmbeddingsWeights(t *testing.T) {
	t.Parallel()
	table, err := estimator.DefaultTable().With([]estimator.Model{{Name: "text-embedding-3-large", Encoding: estimator.EncodingCL100K,
		InputWeightMicro: 2_500_000, OutputWeightMicro: 9 * estimator.WeightOne, DefaultOutputTokens: 1, ContextWindow: 8191, PartTokens: 1}})
	if err != nil {
		t.Fatal(err)
	}
	est := estimator.New(&estimator.Config{Table: table})
	r, err := estimator.ParseEmbeddings([]byte(`{"model":"text-embedding-3-large","input":[1,2,3]}`))
	if err != nil {
		t.Fatal(err)
	}
	e, err := est.Estimate(r)
	if err != nil || e.InputTokens != 3 || e.OutputTokens != 0 || e.Cost != 8 { // ceil(3 * 2.5)
		t.Fatalf("%+v, %v; want 3 input tokens at 2.5: cost 8", e, err)
	}
}

// TestEmbeddingsInvalid: every bad shape names its field, and an input
// over the model's window is refused with the index of the input.
func TestEmbeddingsInvalid(t *testing.T) {
	t.Parallel()
	over := strings.Repeat("a ", 8191) // 8192 tokens in cl100k_base
	if n := count(t, estimator.EncodingCL100K, over); n <= 8191 {
		t.Fatalf("the over-window input counts %d tokens", n)
	}
	tokens := func(n int) string {
		return "[" + strings.TrimSuffix(strings.Repeat("1,", n), ",") + "]"
	}
	cases := []struct {
		name, body, field, reason string
	}{
		{"not json", `embed this`, "body", "byte offset"},
		{"array body", `["hi"]`, "body", "must be a JSON object"},
		{"missing model", `{"input":"hi"}`, "model", "is required"},
		{"model with a NUL", `{"model":"x\u0000","input":"hi"}`, "model", "NUL"},
		{"missing input", `{"model":"text-embedding-3-small"}`, "input", "is required"},
		{"prompt is not input", `{"model":"text-embedding-3-small","prompt":"hi"}`, "input", "is required"},
		{"input object", `{"model":"text-embedding-3-small","input":{"text":"hi"}}`, "input", "must be a string or an array"},
		{"input number", `{"model":"text-embedding-3-small","input":7}`, "input", "must be a string or an array"},
		{"empty string", `{"model":"text-embedding-3-small","input":""}`, "input", "empty string"},
		{"empty array", `{"model":"text-embedding-3-small","input":[]}`, "input", "must not be empty"},
		{"empty string in batch", `{"model":"text-embedding-3-small","input":["a",""]}`, "input[1]", "empty string"},
		{"mixed batch", `{"model":"text-embedding-3-small","input":["a",[1]]}`, "input[1]", "must be a string"},
		{"message items", `{"model":"text-embedding-3-small","input":[{"role":"user","content":"hi"}]}`, "input[0]", "must be a string, a token id or an array of token ids"},
		{"null item", `{"model":"text-embedding-3-small","input":[null]}`, "input[0]", "must be a string, a token id or an array of token ids"},
		{"negative token", `{"model":"text-embedding-3-small","input":[1,-2]}`, "input[1]", "non-negative"},
		{"fractional token", `{"model":"text-embedding-3-small","input":[1.5]}`, "input[0]", "non-negative integer"},
		{"string among tokens", `{"model":"text-embedding-3-small","input":[1,"a"]}`, "input[1]", "must be a token id"},
		{"empty token array", `{"model":"text-embedding-3-small","input":[[1],[]]}`, "input[1]", "must not be empty"},
		{"bad token in array", `{"model":"text-embedding-3-small","input":[[1],[2,"x"]]}`, "input[1][1]", "must be a token id"},
		{"not an array among arrays", `{"model":"text-embedding-3-small","input":[[1],2]}`, "input[1]", "must be an array of token ids"},
		{"too many inputs", `{"model":"text-embedding-3-small","input":[` + strings.TrimSuffix(strings.Repeat(`"x",`, estimator.MaxMessages+1), ",") + `]}`, "input", "at most"},
		{"dimensions string", `{"model":"text-embedding-3-small","input":"hi","dimensions":"256"}`, "dimensions", "must be an integer"},
		{"dimensions zero", `{"model":"text-embedding-3-small","input":"hi","dimensions":0}`, "dimensions", "at least 1"},
		{"encoding_format number", `{"model":"text-embedding-3-small","input":"hi","encoding_format":1}`, "encoding_format", "must be a string"},
		{"user object", `{"model":"text-embedding-3-small","input":"hi","user":{}}`, "user", "must be a string"},
		{"max_wait_ms negative", `{"model":"text-embedding-3-small","input":"hi","max_wait_ms":-1}`, "max_wait_ms", "at least 0"},
		{"string over the window", `{"model":"text-embedding-3-small","input":"` + over + `"}`, "input", "exceeds the model's context window of 8191"},
		{"token ids over the window", `{"model":"text-embedding-ada-002","input":` + tokens(8192) + `}`, "input", "8192 tokens exceeds the model's context window of 8191"},
		{"batch item over the window", `{"model":"text-embedding-3-large","input":["ok","` + over + `"]}`, "input[1]", "exceeds the model's context window"},
		{"token array over the window", `{"model":"text-embedding-3-large","input":[[1],` + tokens(8192) + `]}`, "input[1]", "8192 tokens exceeds"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			_, err := embeddingsEstimate(t, c.body)
			var ie *estimator.InvalidError
			if !errors.As(err, &ie) || !errors.Is(err, estimator.ErrInvalid) {
				t.Fatalf("error %T %v, want an *InvalidError", err, err)
			}
			if ie.Field != c.field || !strings.Contains(ie.Reason, c.reason) {
				t.Fatalf("%s: %s; want %s: ...%s...", ie.Field, ie.Reason, c.field, c.reason)
			}
		})
	}
	// Exactly the window is accepted.
	if e, err := embeddingsEstimate(t, `{"model":"text-embedding-3-small","input":`+tokens(8191)+`}`); err != nil || e.InputTokens != 8191 {
		t.Fatalf("8191 token ids: %+v, %v", e, err)
	}
}

// FuzzEmbeddings: whatever the body, ParseEmbeddings and Estimate either
// refuse it with a complete *InvalidError or estimate exactly the count
// an independent reading of its input gives, with no output.
func FuzzEmbeddings(f *testing.F) {
	for _, s := range []string{
		`{"model":"text-embedding-3-small","input":"hello"}`,
		`{"model":"text-embedding-3-large","input":["a","b c"],"dimensions":3}`,
		`{"model":"text-embedding-ada-002","input":[1,2,3]}`,
		`{"model":"text-embedding-3-small","input":[[1,2],[3]],"encoding_format":"base64"}`,
		`{"model":"my-embedder","input":"<|endoftext|> x"}`,
		`{"model":"text-embedding-3-small","input":[[],[1]]}`,
		`{"model":"text-embedding-3-small","input":[1e400]}`,
		`{"model":"text-embedding-3-small","input":""}`,
		`{}`, `[]`, `null`,
	} {
		f.Add([]byte(s))
	}
	est := estimator.New(nil)
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := estimator.ParseEmbeddings(body)
		if err != nil {
			checkInvalid(t, err)
			return
		}
		e, err := est.Estimate(r)
		if err != nil {
			checkInvalid(t, err)
			return
		}
		enc := estimator.EncodingO200K
		if m, ok := est.Table().Lookup(r.Model()); ok {
			enc = m.Encoding
		}
		var req struct {
			Input any `json:"input"`
		}
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.UseNumber()
		if err := dec.Decode(&req); err != nil {
			t.Fatalf("body accepted by ParseEmbeddings does not decode: %v", err)
		}
		var want int64
		switch in := req.Input.(type) {
		case string:
			want = count(t, enc, in)
		case []any:
			for _, item := range in {
				switch it := item.(type) {
				case string:
					want += count(t, enc, it)
				case []any:
					want += int64(len(it))
				default:
					want++
				}
			}
		}
		if e.InputTokens != want || e.OutputTokens != 0 || e.Cost != estimator.Cost(want, 0, e.InputWeightMicro, e.OutputWeightMicro) {
			t.Fatalf("estimate %+v, want %d input tokens and no output", e, want)
		}
	})
}

// TestParseForKnowsEmbeddingModels: a body without a route (the HTTP API)
// is an embeddings call when its model is an embedding model, also after an
// admin overrides that model's weights; a chat model's input is a Responses
// body.
func TestParseForKnowsEmbeddingModels(t *testing.T) {
	est := estimator.New(nil)
	over := estimator.Model{Name: "text-embedding-3-large", Encoding: estimator.EncodingCL100K, InputWeightMicro: 2 * estimator.WeightOne,
		OutputWeightMicro: estimator.WeightOne, DefaultOutputTokens: 1, ContextWindow: 8191, PartTokens: 1}
	table, err := est.Table().With([]estimator.Model{over})
	if err != nil {
		t.Fatal(err)
	}
	est.SetTable(table)
	for _, c := range []struct {
		body   string
		output bool
		cost   int64
	}{
		{`{"model":"text-embedding-3-large-2024-01-25","input":["hello world","hello world"]}`, false, 8},
		{`{"model":"text-embedding-3-small","input":"hello world"}`, false, 2},
		{`{"model":"gpt-4o","input":"hello world"}`, true, 0},
	} {
		r, err := est.ParseFor([]byte(c.body))
		if err != nil {
			t.Fatalf("%s: %v", c.body, err)
		}
		e, err := est.Estimate(r)
		if err != nil {
			t.Fatalf("%s: %v", c.body, err)
		}
		if (e.OutputTokens > 0) != c.output || (!c.output && e.Cost != c.cost) {
			t.Fatalf("%s: output %d, cost %d", c.body, e.OutputTokens, e.Cost)
		}
	}
}
