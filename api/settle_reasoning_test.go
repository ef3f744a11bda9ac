package api_test

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/tokengate/tokengate/budget/account"
)

// settleSpy is the store the admission layer decides through: the real
// one, noting each settle it is given, so a test sees what the face parsed
// (the reasoning tokens, which no balance shows).
type settleSpy struct {
	*account.Store
	mu      sync.Mutex
	settles []account.SettleParams
}

func (s *settleSpy) DecideBatch(ctx context.Context, items []account.Item) ([]account.OpResult, error) {
	s.mu.Lock()
	for _, it := range items {
		if it.Op.Settle != nil {
			s.settles = append(s.settles, *it.Op.Settle)
		}
	}
	s.mu.Unlock()
	return s.Store.DecideBatch(ctx, items)
}

func (s *settleSpy) last(t *testing.T) account.SettleParams {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.settles) == 0 {
		t.Fatal("no settle was decided")
	}
	return s.settles[len(s.settles)-1]
}

func (s *settleSpy) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.settles)
}

// TestSettleReasoningTokens: a settle's usage may say how much of its
// output was reasoning, by Chat Completions' name
// (completion_tokens_details) or the Responses API's
// (output_tokens_details); the settle carries it to the domain, and the
// token budget charges the output as before. A count outside 0..output,
// not an integer, or two names that disagree is a 400 naming the field,
// and nothing is decided, debited or written.
func TestSettleReasoningTokens(t *testing.T) {
	t.Parallel()
	spy := &settleSpy{}
	b := setupAPI(t, func(c *testConfig) {
		spy.Store = c.Store
		c.Admissions = spy
	})
	key := b.tenant(t, "acme", lim(100_000, "0.000001"))
	admit := func() string {
		t.Helper()
		var a admitted
		r := b.call(t, key, http.MethodPost, "/v1/admissions", chat(100, "hello"))
		if r.Code != http.StatusCreated {
			t.Fatalf("admission: %d %s", r.Code, r.Body)
		}
		r.json(&a)
		return a.ID
	}
	for _, c := range []struct {
		usage     string
		reasoning int64
	}{
		{`{"prompt_tokens":40,"completion_tokens":25,"completion_tokens_details":{"reasoning_tokens":10}}`, 10},
		{`{"input_tokens":40,"output_tokens":25,"output_tokens_details":{"reasoning_tokens":25}}`, 25},
		{`{"prompt_tokens":40,"completion_tokens":25,"completion_tokens_details":{"reasoning_tokens":7},"output_tokens_details":{"reasoning_tokens":7}}`, 7},
		{`{"prompt_tokens":40,"completion_tokens":25,"completion_tokens_details":{"reasoning_tokens":0}}`, 0},
		{`{"prompt_tokens":40,"completion_tokens":25,"completion_tokens_details":{}}`, 0},
		{`{"prompt_tokens":40,"completion_tokens":25}`, 0},
		// Anthropic's usage counts thinking in output_tokens and says no
		// more.
		{`{"input_tokens":40,"output_tokens":25,"cache_read_input_tokens":0}`, 0},
	} {
		id := admit()
		r := b.call(t, key, http.MethodPost, "/v1/admissions/"+id+"/settle", `{"usage":`+c.usage+`}`)
		if r.Code != http.StatusOK || !strings.Contains(r.Body.String(), `"actual":{"input_tokens":40,"output_tokens":25,"cost":65}`) {
			t.Fatalf("%s: %d %s", c.usage, r.Code, r.Body)
		}
		if got := spy.last(t); got.AdmissionID != id || got.ReasoningTokens != c.reasoning || got.OutputTokens != 25 {
			t.Errorf("%s: settled %+v, want %d reasoning tokens", c.usage, got, c.reasoning)
		}
	}

	for _, c := range []struct{ usage, field string }{
		{`{"prompt_tokens":40,"completion_tokens":25,"completion_tokens_details":{"reasoning_tokens":26}}`, "usage.completion_tokens_details.reasoning_tokens"},
		{`{"prompt_tokens":40,"completion_tokens":25,"completion_tokens_details":{"reasoning_tokens":-1}}`, "usage.completion_tokens_details.reasoning_tokens"},
		{`{"prompt_tokens":40,"completion_tokens":25,"completion_tokens_details":{"reasoning_tokens":"many"}}`, "usage.completion_tokens_details.reasoning_tokens"},
		{`{"prompt_tokens":40,"completion_tokens":25,"completion_tokens_details":{"reasoning_tokens":1.5}}`, "usage.completion_tokens_details.reasoning_tokens"},
		{`{"input_tokens":40,"output_tokens":25,"output_tokens_details":{"reasoning_tokens":30}}`, "usage.output_tokens_details.reasoning_tokens"},
		{`{"input_tokens":40,"output_tokens":0,"output_tokens_details":{"reasoning_tokens":1}}`, "usage.output_tokens_details.reasoning_tokens"},
		{`{"prompt_tokens":40,"completion_tokens":25,"completion_tokens_details":{"reasoning_tokens":7},"output_tokens_details":{"reasoning_tokens":8}}`, "usage.output_tokens_details.reasoning_tokens"},
		{`{"prompt_tokens":40,"completion_tokens":25,"completion_tokens_details":[]}`, "usage.completion_tokens_details"},
	} {
		id := admit()
		decided := spy.count()
		before, seq := b.balance(t, "acme")
		r := b.call(t, key, http.MethodPost, "/v1/admissions/"+id+"/settle", `{"usage":`+c.usage+`}`)
		if r.Code != http.StatusBadRequest || r.errorBody().Error.Field != c.field {
			t.Fatalf("%s: %d %s, want 400 naming %s", c.usage, r.Code, r.Body, c.field)
		}
		if after, seq2 := b.balance(t, "acme"); after != before || seq2 != seq || spy.count() != decided {
			t.Fatalf("%s: a bad settle was decided, or moved the balance or the ledger", c.usage)
		}
		b.call(t, key, http.MethodPost, "/v1/admissions/"+id+"/release", "")
	}
}
