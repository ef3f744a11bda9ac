package proxy_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/openai/openai-go/v3"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/ledger"
)

const chatAnswer = `{"id":"c1","object":"chat.completion","created":1,"model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"finish_reason":"stop"}],
	"usage":{"prompt_tokens":20,"completion_tokens":5,"total_tokens":25}}`

func (b *bundle) endUserPolicy(t *testing.T, source rule.EndUserSource, header string, maxEndUsers int) {
	t.Helper()
	_, err := b.store.EndUserPolicySet(ctx, account.EndUserPolicyParams{TenantID: "acme", Source: source, Header: header,
		Template: rule.Limits{TokensCapacity: 50_000, TokensRateMicro: 1}, MaxEndUsers: maxEndUsers, IdleTTL: time.Hour, Actor: "test"})
	if err != nil {
		t.Fatal(err)
	}
}

// settledAs checks that end user endUserID of acme has exactly n
// admissions, all settled, and that its chain and the tenant's verify.
func (b *bundle) settledAs(t *testing.T, endUserID string, n int) {
	t.Helper()
	id := rule.EndUserTenantID("acme", endUserID)
	as, err := b.store.AdmissionRecent(ctx, id, 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(as) != n {
		t.Fatalf("end user %s has %d admissions, want %d", endUserID, len(as), n)
	}
	for _, a := range as {
		if a.State != account.StateSettled {
			t.Fatalf("end user %s: admission %s is %s", endUserID, a.ID, a.State)
		}
	}
	if _, err := ledger.Verify(ctx, b.pool, id); err != nil {
		t.Fatal(err)
	}
	// The tenant's chain has every end user's admission too (nested).
	var inParent int
	if err := b.pool.QueryRow(ctx, `SELECT count(*)::int FROM ledger_entries WHERE tenant_id = 'acme' AND kind = 'settle'
		AND admission_id IN (SELECT id FROM admissions WHERE tenant_id = $1)`, id).Scan(&inParent); err != nil || inParent != n {
		t.Fatalf("the tenant's chain settles %d of the end user's admissions (%v), want %d", inParent, err, n)
	}
	b.verify(t)
}

// OpenAI's user names the end user: the call is admitted and settled as
// that end user (created on first sight, with the tenant's key), and
// every level's chain has it; a call without a user is the tenant's own.
func TestEndUserFromOpenAIUser(t *testing.T) {
	t.Parallel()
	b := setup(t, rule.Limits{TokensCapacity: 100_000, TokensRateMicro: 1})
	b.up.behave = func(w http.ResponseWriter, r *http.Request, body map[string]any) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, chatAnswer)
	}
	b.endUserPolicy(t, rule.SourceUser, "", 10)
	for range 2 {
		p := chatParams(100)
		p.User = openai.String("alice@example.com")
		p.SafetyIdentifier = openai.String("not-the-source")
		if _, err := b.client.Chat.Completions.New(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	b.settledAs(t, "alice@example.com", 2)
	if _, err := b.client.Chat.Completions.New(ctx, chatParams(100)); err != nil {
		t.Fatal(err)
	}
	if as := b.admissions(t); len(as) != 1 {
		t.Fatalf("the tenant's own admissions: %d, want 1 (the call without a user)", len(as))
	}
	list, err := b.store.EndUserList(ctx, "acme", "", 10)
	if err != nil || len(list) != 1 || list[0].EndUserID != "alice@example.com" {
		t.Fatalf("end users %+v %v", list, err)
	}
	// The end user's limit binds below the tenant's: 50 000 of its own.
	snap, err := b.store.TenantSnapshot(ctx, list[0].Snapshot.TenantID)
	if err != nil || snap.Tokens() != 50_000-2*25 {
		t.Fatalf("end user balance %d (%v)", snap.Tokens(), err)
	}

	// A bad id is the caller's 400, naming the field; nothing is admitted.
	for _, body := range []string{
		`{"model":"gpt-4o","max_tokens":10,"messages":[{"role":"user","content":"hi"}],"user":"a\u0007b"}`,
		`{"model":"gpt-4o","max_tokens":10,"messages":[{"role":"user","content":"hi"}],"user":""}`,
		`{"model":"gpt-4o","max_tokens":10,"messages":[{"role":"user","content":"hi"}],"user":42}`,
		`{"model":"gpt-4o","max_tokens":10,"messages":[{"role":"user","content":"hi"}],"user":"` + strings.Repeat("x", 257) + `"}`,
	} {
		status, _, out := b.post(t, body)
		var e struct {
			Error struct {
				Param string `json:"param"`
			} `json:"error"`
		}
		_ = json.Unmarshal([]byte(out), &e)
		if status != http.StatusBadRequest || e.Error.Param != "user" {
			t.Fatalf("%s: %d %s", body, status, out)
		}
	}
	if n, _ := b.store.EndUserList(ctx, "acme", "", 10); len(n) != 1 {
		t.Fatalf("a refused call made an end user: %d", len(n))
	}
}

// The cap: a new end user past max_end_users is a 429 end_user_cap, and
// consumes nothing; a known end user is still served.
func TestEndUserCapOnTheProxy(t *testing.T) {
	t.Parallel()
	b := setup(t, rule.Limits{TokensCapacity: 100_000, TokensRateMicro: 1})
	b.up.behave = func(w http.ResponseWriter, r *http.Request, body map[string]any) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, chatAnswer)
	}
	b.endUserPolicy(t, rule.SourceSafetyIdentifier, "", 1)
	body := func(u string) string {
		return `{"model":"gpt-4o","max_tokens":10,"messages":[{"role":"user","content":"hi"}],"safety_identifier":"` + u + `"}`
	}
	if status, _, out := b.post(t, body("u1")); status != http.StatusOK {
		t.Fatalf("%d %s", status, out)
	}
	before := b.balance(t)
	status, _, out := b.post(t, body("u2"))
	if status != http.StatusTooManyRequests || !strings.Contains(out, `"code":"end_user_cap"`) {
		t.Fatalf("%d %s", status, out)
	}
	if b.balance(t) != before {
		t.Fatal("a call refused at the cap consumed tokens")
	}
	if status, _, out := b.post(t, body("u1")); status != http.StatusOK {
		t.Fatalf("%d %s", status, out)
	}
	b.settledAs(t, "u1", 2)
}

// Anthropic's metadata.user_id names the end user.
func TestEndUserFromAnthropicMetadata(t *testing.T) {
	t.Parallel()
	b := setup(t, rule.Limits{TokensCapacity: 100_000, TokensRateMicro: 1})
	b.up.behave = func(w http.ResponseWriter, r *http.Request, body map[string]any) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, claudeAnswer)
	}
	b.endUserPolicy(t, rule.SourceMetadataUserID, "", 10)
	p := claudeParams(1024, "Say hello.")
	p.Metadata = anthropic.MetadataParam{UserID: anthropic.String("user-7f3a")}
	if _, err := b.anthropicClient(0).Messages.New(ctx, p); err != nil {
		t.Fatal(err)
	}
	b.settledAs(t, "user-7f3a", 1)
	as, _ := b.store.AdmissionRecent(ctx, rule.EndUserTenantID("acme", "user-7f3a"), 1)
	if *as[0].ActualInput != claudeAnswerInput || *as[0].ActualOutput != claudeAnswerOutput {
		t.Fatalf("settled %+v", as[0])
	}
}

// A header names the end user, on chat and on embeddings alike.
func TestEndUserFromHeader(t *testing.T) {
	t.Parallel()
	b := setup(t, rule.Limits{TokensCapacity: 100_000, TokensRateMicro: 1})
	b.up.behave = func(w http.ResponseWriter, r *http.Request, body map[string]any) {
		if r.URL.Path == "/embeddings" || strings.HasSuffix(r.URL.Path, "/embeddings") {
			answerEmbeddings(t, w, body, 0)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, chatAnswer)
	}
	b.endUserPolicy(t, rule.SourceHeader, "x-end-user", 10)
	if status, _, out := b.post(t, `{"model":"gpt-4o","max_tokens":10,"messages":[{"role":"user","content":"hi"}],"user":"ignored"}`,
		"X-End-User", "carol"); status != http.StatusOK {
		t.Fatalf("%d %s", status, out)
	}
	if status, _, out := b.postTo(t, "/v1/embeddings", `{"model":"text-embedding-3-small","input":"hello"}`, "X-End-User", "carol"); status != http.StatusOK {
		t.Fatalf("%d %s", status, out)
	}
	b.settledAs(t, "carol", 2)
	if _, err := b.store.TenantSnapshot(ctx, rule.EndUserTenantID("acme", "ignored")); err == nil {
		t.Fatal("the body's user made an end user while the policy names a header")
	}
}
