package proxy_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"google.golang.org/genai"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
)

// tierPrices prices gpt-4o per million tokens at 2.50 / 10 (default),
// 1.25 / 5 (flex) and 5 / 20 (priority), and claude-sonnet-4-5 at 3 / 15
// (default) and 6 / 30 (priority).
func (b *bundle) tierPrices(t *testing.T) {
	t.Helper()
	if _, err := b.pool.Exec(ctx, `INSERT INTO model_prices (model, service_tier, input_micro, output_micro, effective_from, created_by)
		SELECT m, s, i, o, now() - interval '1 hour', 'test' FROM (VALUES ('gpt-4o', 'default', 2500000, 10000000),
			('gpt-4o', 'flex', 1250000, 5000000), ('gpt-4o', 'priority', 5000000, 20000000),
			('claude-sonnet-4-5', 'default', 3000000, 15000000), ('claude-sonnet-4-5', 'priority', 6000000, 30000000)) v (m, s, i, o)`); err != nil {
		t.Fatal(err)
	}
}

// TestServiceTierChargedAsTheUpstreamReports: each wire's answer names the
// tier that served it (OpenAI's service_tier in a whole answer and in a
// stream's chunks, Anthropic's usage.service_tier), the reservation was
// priced at the tier asked for, and the settle charges the tier reported.
func TestServiceTierChargedAsTheUpstreamReports(t *testing.T) {
	t.Parallel()
	b := setup(t, rule.Limits{TokensCapacity: 100_000, TokensRateMicro: rule.Micro})
	b.tierPrices(t)
	b.up.behave = func(w http.ResponseWriter, r *http.Request, body map[string]any) {
		asked, _ := body["service_tier"].(string)
		served := map[string]string{"flex": "flex", "auto": "priority", "": "default"}[asked]
		switch {
		case r.URL.Path == "/v1/messages":
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-5-20250929","content":[{"type":"text","text":"Hi"}],`+
				`"stop_reason":"end_turn","usage":{"input_tokens":100,"output_tokens":15,"service_tier":"priority"}}`)
		case body["stream"] == true:
			w.Header().Set("Content-Type", "text/event-stream")
			chunk := `{"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-4o","service_tier":%q,%s}`
			writeSSE(w, fmt.Sprintf(chunk, served, `"choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]`),
				fmt.Sprintf(chunk, served, `"choices":[],"usage":{"prompt_tokens":20,"completion_tokens":9,"total_tokens":29}`), "[DONE]")
		default:
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"id":"c1","object":"chat.completion","created":1,"model":"gpt-4o","service_tier":%q,`+
				`"choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":40,"completion_tokens":25,"total_tokens":65}}`, served)
		}
	}
	chat := func(tier string, stream bool) string {
		body := `{"model":"gpt-4o","max_tokens":100,"messages":[{"role":"user","content":"hi"}]`
		if tier != "" {
			body += `,"service_tier":"` + tier + `"`
		}
		if stream {
			body += `,"stream":true`
		}
		return body + "}"
	}
	for _, body := range []string{chat("flex", false), chat("auto", false), chat("", false), chat("flex", true)} {
		if code, _, out := b.post(t, body); code != http.StatusOK {
			t.Fatalf("%s: %d %s", body, code, out)
		}
	}
	req, _ := http.NewRequest(http.MethodPost, b.base+"/v1/messages",
		strings.NewReader(`{"model":"`+claudeModel+`","max_tokens":100,"service_tier":"auto","messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set("X-Api-Key", b.key)
	req.Header.Set("Anthropic-Version", "2023-06-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("messages: %d %s", resp.StatusCode, raw)
	}

	as := b.admissions(t)
	want := []struct {
		reserved, settled string
		money             int64
	}{
		{"flex", "flex", 40*1_250_000/1_000_000 + 25*5},      // 50 + 125
		{"default", "priority", 40*5 + 25*20},                // "auto": reserved at default, served at priority
		{"default", "default", 40*2_500_000/1_000_000 + 250}, // 100 + 250
		{"flex", "flex", 20*1_250_000/1_000_000 + 9*5},       // the stream's chunks name it
		{"default", "priority", 100*6 + 15*30},               // Anthropic's usage.service_tier
	}
	settles := b.spy.settled()
	if len(as) != len(want) || len(settles) != len(want) {
		t.Fatalf("%d admissions, %d settles", len(as), len(settles))
	}
	for i, w := range want {
		a := as[i]
		if a.State != account.StateSettled || a.PriceTier != w.reserved || settles[i].ServiceTier != w.settled || a.MoneyActual == nil || *a.MoneyActual != w.money {
			t.Errorf("call %d: reserved at %q, settled at %q for %v; want %q, %q for %d", i, a.PriceTier, settles[i].ServiceTier, a.MoneyActual, w.reserved, w.settled, w.money)
		}
	}
	b.verify(t)
}

// TestGeminiTrafficTypeChargedAsReported: Vertex AI's
// usageMetadata.trafficType names the tier that served a call, whole or
// streamed: ON_DEMAND_PRIORITY settles at the priority price row,
// ON_DEMAND at the default one, and an answer naming none (AI Studio's) at
// the tier reserved. gemini-2.5-flash is priced at 0.30 / 2.50 (default)
// and 0.60 / 5 (priority) per million tokens.
func TestGeminiTrafficTypeChargedAsReported(t *testing.T) {
	t.Parallel()
	b := setupGemini(t, rule.Limits{TokensCapacity: 100_000, TokensRateMicro: rule.Micro})
	if _, err := b.pool.Exec(ctx, `INSERT INTO model_prices (model, service_tier, input_micro, output_micro, effective_from, created_by)
		SELECT m, s, i, o, now() - interval '1 hour', 'test' FROM (VALUES ('gemini-2.5-flash', 'default', 300000, 2500000),
			('gemini-2.5-flash', 'priority', 600000, 5000000)) v (m, s, i, o)`); err != nil {
		t.Fatal(err)
	}
	served := []string{"ON_DEMAND_PRIORITY", "ON_DEMAND_PRIORITY", "ON_DEMAND", ""}
	var mu sync.Mutex
	calls := 0
	b.up.behave = func(w http.ResponseWriter, r *http.Request, _ map[string]any) {
		mu.Lock()
		traffic := served[calls]
		calls++
		mu.Unlock()
		usage := `{"promptTokenCount":100,"candidatesTokenCount":20,"totalTokenCount":120`
		if traffic != "" {
			usage += `,"trafficType":"` + traffic + `"`
		}
		usage += "}"
		if r.URL.Query().Get("alt") == "sse" {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprintf(w, "data: %s\r\n\r\ndata: %s\r\n\r\n", geminiAnswer("Hi ", "", ""), geminiAnswer("there", "STOP", usage))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, geminiAnswer("Hi there", "STOP", usage))
	}
	vertex := b.geminiClient(t, true, 0)
	cfg := &genai.GenerateContentConfig{MaxOutputTokens: 100}
	if _, err := vertex.Models.GenerateContent(ctx, geminiModel, genai.Text("hi"), cfg); err != nil {
		t.Fatal(err)
	}
	for _, err := range vertex.Models.GenerateContentStream(ctx, geminiModel, genai.Text("hi"), cfg) {
		if err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		if _, err := b.geminiClient(t, false, 0).Models.GenerateContent(ctx, geminiModel, genai.Text("hi"), cfg); err != nil {
			t.Fatal(err)
		}
	}
	want := []struct {
		settled string
		money   int64
	}{
		{"priority", 100*600_000/1_000_000 + 20*5}, // 60 + 100
		{"priority", 160},                          // the stream's last usageMetadata names it
		{"default", 100*300_000/1_000_000 + 50},    // 30 + 20 x 2.50
		{"", 80},                                   // none named: the tier reserved, default
	}
	as, settles := b.admissions(t), b.spy.settled()
	if len(as) != len(want) || len(settles) != len(want) {
		t.Fatalf("%d admissions, %d settles", len(as), len(settles))
	}
	for i, w := range want {
		a := as[i]
		if a.State != account.StateSettled || a.PriceTier != "default" || settles[i].ServiceTier != w.settled || a.MoneyActual == nil || *a.MoneyActual != w.money {
			t.Errorf("call %d: reserved at %q, settled at %q for %v; want default, %q for %d", i, a.PriceTier, settles[i].ServiceTier, a.MoneyActual, w.settled, w.money)
		}
	}
	b.verify(t)
}
