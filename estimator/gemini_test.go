package estimator_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/estimator"
)

// TestGeminiEstimate: a Gemini body's input is its texts (text parts,
// function calls' names and args, function responses, the system
// instruction, function declarations) counted with o200k_base times
// GeminiSafetyFactorMilli, plus 3 a turn and 3 for the reply, plus each
// inline or file part at the model's part default (its base64 never
// counted as text); its output is maxOutputTokens x candidateCount plus
// the thinking budget, or the model's output limit for a thinking level.
func TestGeminiEstimate(t *testing.T) {
	t.Parallel()
	e := estimator.New(nil)
	const schema = `{"type":"object","properties":{"city":{"type":"string"}}}`
	blob := strings.Repeat("QUJD", 50_000) // 200 KB of base64: counted as text it would be tens of thousands of tokens
	for _, tc := range []struct {
		name, model, body string
		texts             []string
		fixed             int64 // framing and parts: not scaled
		out               int64
	}{
		{"plain", "gemini-2.5-flash", `{"contents":[{"role":"user","parts":[{"text":"Hello there"}]}],"generationConfig":{"maxOutputTokens":100}}`,
			[]string{"Hello there"}, 6, 100},
		{"system, candidates, thinking budget", "gemini-2.5-pro", `{"systemInstruction":{"parts":[{"text":"Be terse."}]},
			"contents":[{"role":"user","parts":[{"text":"Hi"}]},{"role":"model","parts":[{"text":"Hello"}]},{"role":"user","parts":[{"text":"Why?"}]}],
			"generationConfig":{"maxOutputTokens":200,"candidateCount":2,"thinkingConfig":{"thinkingBudget":1024}}}`,
			[]string{"Be terse.", "Hi", "Hello", "Why?"}, 12, 200*2 + 1024},
		{"thinking level: the model's output limit", "gemini-3-pro-preview", `{"contents":[{"parts":[{"text":"Hi"}]}],
			"generationConfig":{"max_output_tokens":50,"thinking_config":{"thinking_level":"high"}}}`,
			[]string{"Hi"}, 6, 50 + 65536},
		{"no cap: the model's limit bounds the thoughts too", "gemini-2.0-flash-001", `{"contents":[{"parts":[{"text":"Hi"}]}],"generationConfig":{"thinkingConfig":{"thinkingBudget":-1}}}`,
			[]string{"Hi"}, 6, 8192},
		{"media, calls and tools", "gemini-2.5-flash", `{"contents":[{"role":"user","parts":[{"text":"Weather?"},{"inlineData":{"mimeType":"image/png","data":"` + blob + `"}},
			{"fileData":{"mimeType":"application/pdf","fileUri":"gs://b/f.pdf"}}]},
			{"role":"model","parts":[{"functionCall":{"name":"get_weather","args":{"city":"Paris"}},"thoughtSignature":"` + blob + `"}]},
			{"role":"user","parts":[{"functionResponse":{"name":"get_weather","response":{"temp":21}}}]}],
			"tools":[{"functionDeclarations":[{"name":"get_weather","description":"Weather by city","parameters":` + schema + `}]}],
			"generationConfig":{"maxOutputTokens":10}}`,
			[]string{"Weather?", "get_weather", `{"city":"Paris"}`, "get_weather", `{"temp":21}`, "get_weather", "Weather by city", schema}, 12 + 2*1120, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := estimator.ParseGemini(tc.model, []byte(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			est, err := e.Estimate(req)
			if err != nil {
				t.Fatal(err)
			}
			in := estimator.ScaleGeminiCount(countO200K(t, tc.texts...)) + tc.fixed
			if est.InputTokens != in || est.OutputTokens != tc.out || !est.Approximate {
				t.Fatalf("estimate %+v; want %d in, %d out, approximate", est, in, tc.out)
			}
		})
	}
	// A count's body, bare or as a whole generateContentRequest.
	for _, body := range []string{`{"contents":[{"parts":[{"text":"Hello there"}]}]}`,
		`{"generateContentRequest":{"model":"models/gemini-2.5-flash","contents":[{"parts":[{"text":"Hello there"}]}]}}`} {
		req, err := estimator.ParseGeminiCount("gemini-2.5-flash", []byte(body))
		if err != nil {
			t.Fatal(err)
		}
		est, err := e.Estimate(req)
		if want := estimator.ScaleGeminiCount(countO200K(t, "Hello there")) + 6; err != nil || est.InputTokens != want {
			t.Fatalf("count %s: %+v, %v; want %d in", body, est, err, want)
		}
	}
}

// TestGeminiModels: the seeded families, their windows (input limit plus
// output limit) and their cached weights.
func TestGeminiModels(t *testing.T) {
	t.Parallel()
	table := estimator.DefaultTable()
	for name, want := range map[string][3]int64{
		"gemini-2.5-pro":                   {65536, 1_048_576 + 65536, estimator.WeightOne / 10},
		"gemini-2.5-flash-preview-09-2025": {65536, 1_048_576 + 65536, estimator.WeightOne / 10},
		"gemini-2.5-flash-lite":            {65536, 1_048_576 + 65536, estimator.WeightOne / 10},
		"gemini-2.0-flash-001":             {8192, 1_048_576 + 8192, estimator.WeightOne / 4},
		"gemini-3-pro-preview":             {65536, 1_048_576 + 65536, estimator.WeightOne / 10},
		"gemini-3.1-pro-preview":           {65536, 1_048_576 + 65536, estimator.WeightOne / 10},
	} {
		m, ok := table.Lookup(name)
		if !ok || m.DefaultOutputTokens != want[0] || m.ContextWindow != want[1] || m.CachedInputWeightMicro != want[2] {
			t.Errorf("%s: %+v, %v", name, m, ok)
		}
	}
	if m, _ := table.Lookup("gemini-2.5-flash-lite-preview-06-17"); m.Name != "gemini-2.5-flash-lite" {
		t.Errorf("flash-lite preview: %s", m.Name)
	}
}

// TestGeminiInvalid: every malformed body names its field.
func TestGeminiInvalid(t *testing.T) {
	t.Parallel()
	e := estimator.New(nil)
	for _, tc := range []struct{ model, body, field string }{
		{"gemini-2.5-flash", `[]`, "body"},
		{"", `{"contents":[{"parts":[{"text":"x"}]}]}`, "model"},
		{"gemini-2.5-flash", `{}`, "contents"},
		{"gemini-2.5-flash", `{"contents":{}}`, "contents"},
		{"gemini-2.5-flash", `{"contents":[]}`, "contents"},
		{"gemini-2.5-flash", `{"contents":[{"role":"user"}]}`, "contents[0].parts"},
		{"gemini-2.5-flash", `{"contents":[{"role":"bot","parts":[]}]}`, "contents[0].role"},
		{"gemini-2.5-flash", `{"contents":[{"parts":[{"text":5}]}]}`, "contents[0].parts[0].text"},
		{"gemini-2.5-flash", `{"contents":[{"parts":[{"inlineData":{"mimeType":"image/png"}}]}]}`, "contents[0].parts[0].inlineData.data"},
		{"gemini-2.5-flash", `{"contents":[{"parts":[{"fileData":{}}]}]}`, "contents[0].parts[0].fileData.fileUri"},
		{"gemini-2.5-flash", `{"contents":[{"parts":[{"functionCall":{"args":{}}}]}]}`, "contents[0].parts[0].functionCall.name"},
		{"gemini-2.5-flash", `{"contents":[{"parts":[{"text":"x"}]}],"generationConfig":{"maxOutputTokens":0}}`, "generationConfig.maxOutputTokens"},
		{"gemini-2.5-flash", `{"contents":[{"parts":[{"text":"x"}]}],"generationConfig":{"candidateCount":"2"}}`, "generationConfig.candidateCount"},
		{"gemini-2.5-flash", `{"contents":[{"parts":[{"text":"x"}]}],"generationConfig":{"thinkingConfig":{"thinkingBudget":-2}}}`, "generationConfig.thinkingConfig.thinkingBudget"},
		{"gemini-2.5-flash", `{"contents":[{"parts":[{"text":"x"}]}],"tools":[{"functionDeclarations":[{"description":"no name"}]}]}`, "tools[0].functionDeclarations[0].name"},
		{"gemini-2.5-flash", `{"contents":[{"parts":[{"text":"x"}]}],"systemInstruction":"be terse"}`, "systemInstruction"},
	} {
		_, err := estimator.ParseGemini(tc.model, []byte(tc.body))
		var inv *estimator.InvalidError
		if !errors.As(err, &inv) || inv.Field != tc.field {
			t.Errorf("%s: %v; want a refusal of %s", tc.body, err, tc.field)
		}
	}
	// Past the model's output limit: refused at the estimate, naming
	// Google's field.
	req, err := estimator.ParseGemini("gemini-2.0-flash", []byte(`{"contents":[{"parts":[{"text":"x"}]}],"generationConfig":{"maxOutputTokens":9000}}`))
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.Estimate(req)
	var inv *estimator.InvalidError
	if !errors.As(err, &inv) || inv.Field != "generationConfig.maxOutputTokens" {
		t.Fatalf("over the output limit: %v", err)
	}
}

// typicalGemini is typicalChat in Gemini's shape: the same system prompt
// and turns, with a thinking budget.
var typicalGemini = func() []byte {
	var chat struct {
		Messages []struct{ Role, Content string } `json:"messages"`
	}
	if err := json.Unmarshal([]byte(typicalChat), &chat); err != nil {
		panic(err)
	}
	type part struct {
		Text string `json:"text"`
	}
	type content struct {
		Role  string `json:"role,omitempty"`
		Parts []part `json:"parts"`
	}
	body := struct {
		System   content        `json:"systemInstruction"`
		Contents []content      `json:"contents"`
		Config   map[string]any `json:"generationConfig"`
	}{Config: map[string]any{"maxOutputTokens": 800, "temperature": 0.3, "thinkingConfig": map[string]any{"thinkingBudget": 1024}}}
	for _, m := range chat.Messages {
		switch m.Role {
		case "system":
			body.System = content{Parts: []part{{m.Content}}}
		case "assistant":
			body.Contents = append(body.Contents, content{Role: "model", Parts: []part{{m.Content}}})
		default:
			body.Contents = append(body.Contents, content{Role: "user", Parts: []part{{m.Content}}})
		}
	}
	raw, err := json.Marshal(body)
	if err != nil {
		panic(err)
	}
	return raw
}()

// BenchmarkEstimateGemini is BenchmarkEstimate's conversation on the
// Gemini wire: what its parse and scaled count cost beside OpenAI's.
func BenchmarkEstimateGemini(b *testing.B) {
	est := estimator.New(nil)
	if r, err := estimator.ParseGemini("gemini-2.5-flash", typicalGemini); err != nil {
		b.Fatal(err)
	} else if _, err := est.Estimate(r); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(typicalGemini)))
	b.ReportAllocs()
	for b.Loop() {
		r, err := estimator.ParseGemini("gemini-2.5-flash", typicalGemini)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := est.Estimate(r); err != nil {
			b.Fatal(err)
		}
	}
}
