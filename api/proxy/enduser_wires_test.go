package proxy_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"

	"github.com/tokengate/tokengate/budget/rule"
)

// postMessages sends a raw Messages call with the tenant's key and the
// headers given as name, value pairs; it returns the status and the body.
func (b *bundle) postMessages(t *testing.T, body string, headers ...string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, b.base+"/v1/messages", strings.NewReader(body))
	req.Header.Set("X-Api-Key", b.key)
	req.Header.Set("Anthropic-Version", "2023-06-01")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(raw)
}

// endUserBalance is end user id of acme's token balance.
func (b *bundle) endUserBalance(t *testing.T, id string) int64 {
	t.Helper()
	snap, err := b.store.TenantSnapshot(ctx, rule.EndUserTenantID("acme", id))
	if err != nil {
		t.Fatalf("end user %s: %v", id, err)
	}
	return snap.Tokens()
}

// claudeAnswerCost is what one claudeAnswer settles at.
const claudeAnswerCost = claudeAnswerInput + claudeAnswerOutput

// A policy of user (or safety_identifier) names a Messages call's end user
// by metadata.user_id, Anthropic's one end-user field (issue 36 item 6: it
// was charged to the team in silence); the same policy still reads an
// OpenAI call's user, so one tenant's end users are the same budgets on
// both wires.
func TestEndUserPolicyOfUserReadsAnthropicMetadata(t *testing.T) {
	t.Parallel()
	for _, source := range []rule.EndUserSource{rule.SourceUser, rule.SourceSafetyIdentifier} {
		t.Run(string(source), func(t *testing.T) {
			t.Parallel()
			b := setup(t, rule.Limits{TokensCapacity: 100_000, TokensRateMicro: 1})
			b.up.behave = func(w http.ResponseWriter, r *http.Request, body map[string]any) {
				w.Header().Set("Content-Type", "application/json")
				if strings.HasSuffix(r.URL.Path, "/messages") {
					fmt.Fprint(w, claudeAnswer)
					return
				}
				fmt.Fprint(w, chatAnswer)
			}
			b.endUserPolicy(t, source, "", 10)
			p := claudeParams(1024, "Say hello.")
			p.Metadata = anthropic.MetadataParam{UserID: anthropic.String("dana")}
			if _, err := b.anthropicClient(0).Messages.New(ctx, p); err != nil {
				t.Fatal(err)
			}
			body := `{"model":"gpt-4o","max_tokens":10,"messages":[{"role":"user","content":"hi"}],"` + string(source) + `":"dana"}`
			if status, _, out := b.post(t, body); status != http.StatusOK {
				t.Fatalf("%d %s", status, out)
			}
			b.settledAs(t, "dana", 2)
			if got, want := b.endUserBalance(t, "dana"), int64(50_000-claudeAnswerCost-25); got != want {
				t.Fatalf("dana's balance %d, want %d", got, want)
			}
			if as := b.admissions(t); len(as) != 0 {
				t.Fatalf("the team was charged for %d of its end user's calls", len(as))
			}
			if got, want := b.balance(t), int64(100_000-claudeAnswerCost-25); got != want {
				t.Fatalf("the tenant's balance %d, want %d", got, want)
			}
		})
	}
}

// A request that names its end user in a field the policy does not read
// on its wire is refused with a 400 naming the field the policy reads,
// with nothing admitted, no end user made and no upstream call: never
// decided as the team's own in silence. A request that names no end user
// at all is still the team's own.
func TestEndUserInAnotherFieldIsRefusedNamingTheField(t *testing.T) {
	t.Parallel()
	b := setup(t, rule.Limits{TokensCapacity: 100_000, TokensRateMicro: 1})
	var calls int
	var mu sync.Mutex
	b.up.behave = func(w http.ResponseWriter, r *http.Request, body map[string]any) {
		mu.Lock()
		calls++
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if strings.HasSuffix(r.URL.Path, "/messages") {
			fmt.Fprint(w, claudeAnswer)
			return
		}
		fmt.Fprint(w, chatAnswer)
	}
	openAIParam := func(out string) string {
		var e struct {
			Error struct {
				Param string `json:"param"`
			} `json:"error"`
		}
		_ = json.Unmarshal([]byte(out), &e)
		return e.Error.Param
	}
	const chat = `{"model":"gpt-4o","max_tokens":10,"messages":[{"role":"user","content":"hi"}]`
	const claude = `{"model":"` + claudeModel + `","max_tokens":100,"messages":[{"role":"user","content":"hi"}]`

	// A policy of user: safety_identifier alone, or OpenAI's metadata.user_id.
	b.endUserPolicy(t, rule.SourceUser, "", 10)
	for _, body := range []string{chat + `,"safety_identifier":"erin"}`, chat + `,"metadata":{"user_id":"erin"}}`} {
		if status, _, out := b.post(t, body); status != http.StatusBadRequest || openAIParam(out) != "user" ||
			!strings.Contains(out, "names end users by user") {
			t.Fatalf("%s: %d %s", body, status, out)
		}
	}
	// A policy of safety_identifier: user alone.
	b.endUserPolicy(t, rule.SourceSafetyIdentifier, "", 10)
	if status, _, out := b.post(t, chat+`,"user":"erin"}`); status != http.StatusBadRequest || openAIParam(out) != "safety_identifier" {
		t.Fatalf("%d %s", status, out)
	}
	// A policy of a header: the body names one, the header is missing, on
	// both wires.
	b.endUserPolicy(t, rule.SourceHeader, "x-end-user", 10)
	if status, _, out := b.post(t, chat+`,"user":"erin"}`); status != http.StatusBadRequest || openAIParam(out) != "X-End-User" {
		t.Fatalf("%d %s", status, out)
	}
	if status, out := b.postMessages(t, claude+`,"metadata":{"user_id":"erin"}}`); status != http.StatusBadRequest ||
		!strings.Contains(out, `"invalid_request_error"`) || !strings.Contains(out, "X-End-User: is required") {
		t.Fatalf("%d %s", status, out)
	}
	if n, _ := b.store.EndUserList(ctx, "acme", "", 10); len(n) != 0 || calls != 0 || len(b.admissions(t)) != 0 {
		t.Fatalf("refused calls made %d end users, %d upstream calls, %d admissions", len(n), calls, len(b.admissions(t)))
	}
	// A Messages call under a policy of metadata.user_id that names none,
	// and an OpenAI call that names none: the team's own.
	b.endUserPolicy(t, rule.SourceMetadataUserID, "", 10)
	if status, out := b.postMessages(t, claude+`}`); status != http.StatusOK {
		t.Fatalf("%d %s", status, out)
	}
	if status, _, out := b.post(t, chat+`}`); status != http.StatusOK {
		t.Fatalf("%d %s", status, out)
	}
	if got, want := b.balance(t), int64(100_000-claudeAnswerCost-25); len(b.admissions(t)) != 2 || got != want {
		t.Fatalf("the team's own: %d admissions, balance %d, want 2 and %d", len(b.admissions(t)), got, want)
	}
	b.verify(t)
}

// Many callers on both wires at once, under a policy of user: OpenAI calls
// name their end user by user, Messages calls by metadata.user_id, some
// calls name none. Every end user is charged exactly its own calls on
// both wires, the team exactly its own, and the tenant everything; every
// chain verifies.
func TestEndUsersConcurrentOnBothWires(t *testing.T) {
	t.Parallel()
	b := setup(t, rule.Limits{TokensCapacity: 1_000_000, TokensRateMicro: 1})
	b.up.behave = func(w http.ResponseWriter, r *http.Request, body map[string]any) {
		w.Header().Set("Content-Type", "application/json")
		if strings.HasSuffix(r.URL.Path, "/messages") {
			fmt.Fprint(w, claudeAnswer)
			return
		}
		fmt.Fprint(w, chatAnswer)
	}
	b.endUserPolicy(t, rule.SourceUser, "", 10)
	users := []string{"ann", "bob", "cy", "dee", ""} // "": the team's own
	const goroutines, perGoroutine = 24, 5
	var mu sync.Mutex
	spent := map[string]int64{}
	calls := map[string]int{}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for g := range goroutines {
		wg.Go(func() {
			<-start
			for i := range perGoroutine {
				user := users[(g+i)%len(users)]
				var cost int64
				if (g+i)%2 == 0 {
					body := `{"model":"gpt-4o","max_tokens":10,"messages":[{"role":"user","content":"hi"}]`
					if user != "" {
						body += `,"user":"` + user + `"`
					}
					if status, _, out := b.post(t, body+`}`); status != http.StatusOK {
						t.Errorf("chat as %q: %d %s", user, status, out)
						return
					}
					cost = 25
				} else {
					body := `{"model":"` + claudeModel + `","max_tokens":100,"messages":[{"role":"user","content":"hi"}]`
					if user != "" {
						body += `,"metadata":{"user_id":"` + user + `"}`
					}
					if status, out := b.postMessages(t, body+`}`); status != http.StatusOK {
						t.Errorf("messages as %q: %d %s", user, status, out)
						return
					}
					cost = claudeAnswerCost
				}
				mu.Lock()
				spent[user] += cost
				calls[user]++
				mu.Unlock()
			}
		})
	}
	close(start)
	wg.Wait()
	if t.Failed() {
		return
	}
	var total int64
	for _, u := range users {
		total += spent[u]
		if u == "" {
			if got, n := b.admissions(t), calls[""]; len(got) != n {
				t.Fatalf("the team's own admissions %d, want %d", len(got), n)
			}
			continue
		}
		b.settledAs(t, u, calls[u])
		if got, want := b.endUserBalance(t, u), 50_000-spent[u]; got != want {
			t.Fatalf("end user %s: balance %d, want %d (%d calls)", u, got, want, calls[u])
		}
	}
	if got, want := b.balance(t), 1_000_000-total; got != want {
		t.Fatalf("the tenant's balance %d, want %d", got, want)
	}
	if list, err := b.store.EndUserList(ctx, "acme", "", 10); err != nil || len(list) != 4 {
		t.Fatalf("end users %d (%v), want 4", len(list), err)
	}
	b.verify(t)
}
