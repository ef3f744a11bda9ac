package estimator_test

import (
	"bytes"
	"encoding/base64"
	"errors"
	"image"
	"image/png"
	"testing"

	"github.com/tokengate/tokengate/estimator"
)

// pngBase64 is a w x h PNG, base64-encoded as Anthropic's image source
// carries it.
func pngBase64(t *testing.T, w, h int) string {
	t.Helper()
	var buf bytes.Buffer
	if err := png.Encode(&buf, image.NewGray(image.Rect(0, 0, w, h))); err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(buf.Bytes())
}

func countO200K(t *testing.T, texts ...string) int64 {
	t.Helper()
	var n int64
	for _, s := range texts {
		c, err := estimator.CountText(estimator.EncodingO200K, s)
		if err != nil {
			t.Fatal(err)
		}
		n += int64(c)
	}
	return n
}

// TestMessagesEstimate: the Messages shape's input is its texts counted
// with o200k_base times the family's safety factor, plus framing (3 per
// message and 3 for the reply), Anthropic's tool system prompt (346) when
// tools are given, and images by Anthropic's rule from their header; the
// output is max_tokens or a larger thinking budget. Every estimate is
// approximate.
func TestMessagesEstimate(t *testing.T) {
	t.Parallel()
	e := estimator.New(nil)
	small, big := pngBase64(t, 200, 100), pngBase64(t, 3000, 1500)
	const schema = `{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}`
	for _, tc := range []struct {
		name      string
		body      string
		family    string
		texts     []string
		fixed     int64 // framing, images, tool prompt: not scaled
		out       int64
		factorMil int64
	}{
		{"system string", `{"model":"claude-sonnet-4-5-20250929","max_tokens":100,"system":"You are terse.","messages":[{"role":"user","content":"Hello there"}]}`,
			"claude-sonnet-4-5", []string{"You are terse.", "Hello there"}, 6, 100, 1250},
		{"system blocks, newer tokenizer", `{"model":"claude-opus-5-5","max_tokens":64,"system":[{"type":"text","text":"Be brief.","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":[{"type":"text","text":"Hi"}]},{"role":"assistant","content":"Hello"}]}`,
			"claude-opus-5-5", []string{"Be brief.", "Hi", "Hello"}, 9, 64, 1625},
		{"tools, tool_use and tool_result", `{"model":"claude-haiku-4-5","max_tokens":200,"tools":[{"name":"weather","description":"Get the weather","input_schema":` + schema + `}],
			"messages":[{"role":"user","content":"Weather in Paris?"},{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"weather","input":{"city":"Paris"}}]},
			{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"sunny"}]}]}]}`,
			"claude-haiku-4-5", []string{"weather", "Get the weather", schema, "Weather in Paris?", "weather", `{"city":"Paris"}`, "sunny"}, 3 + 9 + 346, 200, 1250},
		{"thinking block and budget beyond max_tokens", `{"model":"claude-sonnet-4-5","max_tokens":1000,"thinking":{"type":"enabled","budget_tokens":4000},"messages":[{"role":"assistant","content":[{"type":"thinking","thinking":"Let me see.","signature":"x"}]},{"role":"user","content":"go on"}]}`,
			"claude-sonnet-4-5", []string{"Let me see.", "go on"}, 9, 4000, 1250},
		{"images: small by its size, large at the cap, URL at the default", `{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[{"role":"user","content":[
			{"type":"image","source":{"type":"base64","media_type":"image/png","data":"` + small + `"}},
			{"type":"image","source":{"type":"base64","media_type":"image/png","data":"` + big + `"}},
			{"type":"image","source":{"type":"url","url":"https://example.com/a.png"}},
			{"type":"text","text":"Compare."}]}]}`,
			"claude-sonnet-4-5", []string{"Compare."}, 6 + 27 + 1600 + 1600, 10, 1250},
		{"PDF: two parts a page", `{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[{"role":"user","content":[{"type":"document","source":{"type":"base64","media_type":"application/pdf","data":"` +
			base64.StdEncoding.EncodeToString([]byte("%PDF-1.4\n1 0 obj <</Type /Pages /Kids [2 0 R 3 0 R 4 0 R]>>\n2 0 obj <</Type /Page>>\n3 0 obj <</Type/Page /Parent 1 0 R>>\n4 0 obj <</Type /Page>>\n")) + `"}}]}]}`,
			"claude-sonnet-4-5", nil, 6 + 3*2*1600, 10, 1250},
		{"text document", `{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[{"role":"user","content":[{"type":"document","title":"Memo","source":{"type":"text","media_type":"text/plain","data":"The quarterly numbers."}}]}]}`,
			"claude-sonnet-4-5", []string{"Memo", "The quarterly numbers."}, 6, 10, 1250},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := estimator.ParseMessages([]byte(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			est, err := e.Estimate(req)
			if err != nil {
				t.Fatal(err)
			}
			n := countO200K(t, tc.texts...)
			want := tc.fixed + (n*tc.factorMil+999)/1000
			if est.Family != tc.family || est.InputTokens != want || est.OutputTokens != tc.out || !est.Approximate {
				t.Fatalf("estimate %+v, want family %s, input %d (%d counted), output %d, approximate", est, tc.family, want, n, tc.out)
			}
			if est.Cost != est.InputTokens+est.OutputTokens {
				t.Fatalf("cost %d at weights 1, want %d", est.Cost, est.InputTokens+est.OutputTokens)
			}
		})
	}
}

// TestMessagesCountTokensNeedsNoMaxTokens: count_tokens bodies name no
// max_tokens; a Messages call must.
func TestMessagesCountTokensNeedsNoMaxTokens(t *testing.T) {
	t.Parallel()
	body := []byte(`{"model":"claude-sonnet-4-5","messages":[{"role":"user","content":"Hello"}]}`)
	if _, err := estimator.ParseCountTokens(body); err != nil {
		t.Fatal(err)
	}
	_, err := estimator.ParseMessages(body)
	var inv *estimator.InvalidError
	if !errors.As(err, &inv) || inv.Field != "max_tokens" {
		t.Fatalf("ParseMessages without max_tokens = %v, want max_tokens required", err)
	}
}

// TestMessagesInvalid: each malformed Messages body names its field.
func TestMessagesInvalid(t *testing.T) {
	t.Parallel()
	e := estimator.New(nil)
	for _, tc := range []struct{ body, field string }{
		{`{"max_tokens":5,"messages":[{"role":"user","content":"x"}]}`, "model"},
		{`{"model":"claude-sonnet-4-5","max_tokens":0,"messages":[{"role":"user","content":"x"}]}`, "max_tokens"},
		{`{"model":"claude-sonnet-4-5","max_tokens":5,"messages":[]}`, "messages"},
		{`{"model":"claude-sonnet-4-5","max_tokens":5,"messages":[{"role":"tool","content":"x"}]}`, "messages[0].role"},
		{`{"model":"claude-sonnet-4-5","max_tokens":5,"messages":[{"role":"user"}]}`, "messages[0].content"},
		{`{"model":"claude-sonnet-4-5","max_tokens":5,"messages":[{"role":"user","content":[{"text":"x"}]}]}`, "messages[0].content[0].type"},
		{`{"model":"claude-sonnet-4-5","max_tokens":5,"messages":[{"role":"user","content":[{"type":"image"}]}]}`, "messages[0].content[0].source"},
		{`{"model":"claude-sonnet-4-5","max_tokens":5,"system":7,"messages":[{"role":"user","content":"x"}]}`, "system"},
		{`{"model":"claude-sonnet-4-5","max_tokens":5,"stream":"yes","messages":[{"role":"user","content":"x"}]}`, "stream"},
		{`{"model":"claude-sonnet-4-5","max_tokens":5,"thinking":{"type":"enabled","budget_tokens":-1},"messages":[{"role":"user","content":"x"}]}`, "thinking.budget_tokens"},
		{`{"model":"claude-sonnet-4-5","max_tokens":5,"tools":[{"name":"x","input_schema":"no"}],"messages":[{"role":"user","content":"x"}]}`, "tools[0].input_schema"},
		// Beyond the model's output cap (64000 for Sonnet 4.5).
		{`{"model":"claude-sonnet-4-5","max_tokens":64001,"messages":[{"role":"user","content":"x"}]}`, "max_tokens"},
	} {
		req, err := estimator.ParseMessages([]byte(tc.body))
		if err == nil {
			_, err = e.Estimate(req)
		}
		var inv *estimator.InvalidError
		if !errors.As(err, &inv) || inv.Field != tc.field {
			t.Errorf("%s: %v, want an InvalidError on %s", tc.body, err, tc.field)
		}
	}
}

// TestImageTokens is Anthropic's published rule: w*h/750 after scaling
// to 1568 px on the long edge, at most 1600.
func TestImageTokens(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ w, h, want int64 }{
		{200, 200, 54},     // 40000/750 = 53.3
		{1000, 1000, 1334}, // 1333.3
		{1092, 1092, 1590}, // Anthropic's 1:1 example, ~1590
		{1568, 1568, 1600}, // over ~1.15 MP: capped
		{3136, 1568, 1600}, // scaled to 1568x784 (1639): capped
		{2000, 100, 164},   // scaled to 1568x78: 163.07
		{0, 10, 0},
	} {
		if got := estimator.ImageTokens(tc.w, tc.h); got != tc.want {
			t.Errorf("ImageTokens(%d, %d) = %d, want %d", tc.w, tc.h, got, tc.want)
		}
	}
}

// TestEffectiveCacheInput: cache reads, 5 minute and 1 hour writes are
// priced at their weights (an unset one at the input's, an unset 1 h at
// the 5 min one's), rounded up once, never more than the input.
func TestEffectiveCacheInput(t *testing.T) {
	t.Parallel()
	claude := estimator.Model{InputWeightMicro: estimator.WeightOne, CachedInputWeightMicro: estimator.WeightOne / 10,
		CacheWriteWeightMicro: estimator.WeightOne * 5 / 4, CacheWrite1hWeightMicro: 2 * estimator.WeightOne}
	plain := estimator.Model{InputWeightMicro: 2 * estimator.WeightOne}
	writeOnly := estimator.Model{InputWeightMicro: estimator.WeightOne, CacheWriteWeightMicro: 3 * estimator.WeightOne / 2}
	for _, tc := range []struct {
		m    estimator.Model
		in   int64
		c    estimator.CacheUsage
		want int64
	}{
		{claude, 1000, estimator.CacheUsage{}, 1000},
		{claude, 1000, estimator.CacheUsage{Read: 800}, 200 + 80},
		{claude, 1000, estimator.CacheUsage{Write5m: 400}, 600 + 500},
		{claude, 1000, estimator.CacheUsage{Write1h: 400}, 600 + 800},
		{claude, 1000, estimator.CacheUsage{Read: 1, Write5m: 1, Write1h: 1}, 997 + 4}, // 0.1+1.25+2 = 3.35 -> 4
		{claude, 100, estimator.CacheUsage{Read: 90, Write5m: 90}, 9 + 13},             // writes clamped to the 10 left: 12.5 -> 13
		{plain, 100, estimator.CacheUsage{Read: 50, Write5m: 20}, 100},                 // unset weights are the input's
		{writeOnly, 100, estimator.CacheUsage{Write5m: 10, Write1h: 10}, 80 + 30},      // unset 1 h is the 5 min weight
	} {
		if got := tc.m.EffectiveCacheInput(tc.in, tc.c); got != tc.want {
			t.Errorf("%+v.EffectiveCacheInput(%d, %+v) = %d, want %d", tc.m, tc.in, tc.c, got, tc.want)
		}
	}
	// EffectiveInput is the read-only case.
	if got := claude.EffectiveInput(1000, 800); got != 280 {
		t.Fatalf("EffectiveInput = %d, want 280", got)
	}
}

// FuzzEstimateMessages: whatever the body, ParseMessages and Estimate
// answer a complete *InvalidError or a consistent, deterministic,
// approximate estimate whose input is at least the o200k count of the
// messages' text; count_tokens accepts every body a call is accepted with.
func FuzzEstimateMessages(f *testing.F) {
	for _, s := range []string{
		`{"model":"claude-sonnet-4-5","max_tokens":100,"system":"You are terse.","messages":[{"role":"user","content":"Hello there"}]}`,
		`{"model":"claude-opus-5-5","max_tokens":64,"system":[{"type":"text","text":"Be brief."}],"messages":[{"role":"user","content":[{"type":"text","text":"Hi"}]},{"role":"assistant","content":"Hello"}]}`,
		`{"model":"claude-haiku-4-5","max_tokens":200,"tools":[{"name":"w","description":"d","input_schema":{"type":"object"}},{"type":"web_search_20250305","name":"web_search"}],"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"w","input":{"a":1}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"ok"}]}]}]}`,
		`{"model":"claude-sonnet-4-5","max_tokens":1000,"thinking":{"type":"enabled","budget_tokens":4000},"messages":[{"role":"assistant","content":[{"type":"thinking","thinking":"hm","signature":"s"},{"type":"redacted_thinking","data":"xx"}]},{"role":"user","content":"go"}]}`,
		`{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAAAAAA6fptVAAAACklEQVR4nGNgAAAAAgABSK+kcQAAAABJRU5ErkJggg=="}},{"type":"document","source":{"type":"base64","data":"JVBERi0xLjQKL1R5cGUgL1BhZ2UK"}}]}]}`,
		`{"model":"x","max_tokens":1,"messages":[{"role":"system","content":"s"}]}`, `{}`, `[]`,
	} {
		f.Add([]byte(s))
	}
	est := estimator.New(nil)
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := estimator.ParseMessages(body)
		if err != nil {
			checkInvalid(t, err)
			return
		}
		if _, err := estimator.ParseCountTokens(body); err != nil {
			t.Fatalf("count_tokens refuses a body a call is accepted with: %v", err)
		}
		e, err := est.Estimate(r)
		if err != nil {
			checkInvalid(t, err)
			return
		}
		if e.InputTokens < 0 || e.OutputTokens < 1 || !e.Approximate || e.Cost != estimator.Cost(e.InputTokens, e.OutputTokens, e.InputWeightMicro, e.OutputWeightMicro) {
			t.Fatalf("inconsistent estimate %+v", e)
		}
		if again, err := est.Estimate(r); err != nil || again != e {
			t.Fatalf("estimate not deterministic: %+v then %+v, %v", e, again, err)
		}
		var sum int64
		for _, s := range messageTexts(t, body) {
			sum += count(t, estimator.EncodingO200K, s)
		}
		if e.InputTokens < sum {
			t.Fatalf("InputTokens %d < %d, the count of the messages' text", e.InputTokens, sum)
		}
	})
}
