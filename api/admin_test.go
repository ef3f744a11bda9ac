package api_test

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/budget/replica"
	"github.com/tokengate/tokengate/estimator"
	"github.com/tokengate/tokengate/integration/pgtest"
)

// admin returns an admin token for the bundle's database.
func (b *apiBundle) admin(t testing.TB, name string) string {
	t.Helper()
	_, secret, err := credential.AdminTokenCreate(ctx, b.pool, name)
	if err != nil {
		t.Fatal(err)
	}
	return secret
}

func (b *apiBundle) adminCall(t testing.TB, token, method, path string, body any) response {
	t.Helper()
	var raw string
	switch v := body.(type) {
	case nil:
	case string:
		raw = v
	default:
		j, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		raw = string(j)
	}
	return b.call(t, token, method, path, raw)
}

type tenantJSON struct {
	Tenant   string `json:"tenant"`
	Disabled bool   `json:"disabled"`
	Limits   struct {
		TokensCapacity    int64        `json:"tokens_capacity"`
		TokensPerSecond   json.Number  `json:"tokens_per_second"`
		RequestsCapacity  *int64       `json:"requests_capacity"`
		RequestsPerSecond *json.Number `json:"requests_per_second"`
		MaxConcurrent     *int64       `json:"max_concurrent"`
		PeriodBudget      *int64       `json:"period_budget"`
		Period            *string      `json:"period"`
	} `json:"limits"`
	Balances struct {
		Tokens json.Number `json:"tokens"`
	} `json:"balances"`
}

func TestAdminAuth(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, nil)
	key := b.tenant(t, "acme", lim(1000, "1"))
	token := b.admin(t, "ops")
	for name, cred := range map[string]string{"none": "", "tenant key": key, "garbage": "tga_nope", "wrong secret": token[:len(token)-2] + "zz"} {
		if r := b.adminCall(t, cred, http.MethodGet, "/v1/admin/tenants", nil); r.Code != http.StatusUnauthorized {
			t.Fatalf("%s: %d %s", name, r.Code, r.Body)
		}
	}
	if r := b.adminCall(t, token, http.MethodGet, "/v1/admin/tenants", nil); r.Code != http.StatusOK {
		t.Fatalf("valid token: %d %s", r.Code, r.Body)
	}
	// An admin token is not a tenant key either.
	if r := b.call(t, token, http.MethodGet, "/v1/budget", ""); r.Code != http.StatusUnauthorized {
		t.Fatalf("admin token on a tenant route: %d", r.Code)
	}
	// Revoked tokens are refused, and listing shows the revocation.
	var list struct {
		Tokens []credential.AdminToken `json:"tokens"`
	}
	b.adminCall(t, token, http.MethodGet, "/v1/admin/tokens", nil).json(&list)
	other := b.admin(t, "temp")
	var tempID string
	b.adminCall(t, token, http.MethodGet, "/v1/admin/tokens", nil).json(&list)
	for _, tk := range list.Tokens {
		if tk.Name == "temp" {
			tempID = tk.ID
		}
	}
	if strings.Contains(b.adminCall(t, token, http.MethodGet, "/v1/admin/tokens", nil).Body.String(), other[len(other)-20:]) {
		t.Fatal("the token list shows a secret")
	}
	if r := b.adminCall(t, token, http.MethodDelete, "/v1/admin/tokens/"+tempID, nil); r.Code != http.StatusNoContent {
		t.Fatalf("revoke: %d %s", r.Code, r.Body)
	}
	if r := b.adminCall(t, other, http.MethodGet, "/v1/admin/tenants", nil); r.Code != http.StatusUnauthorized {
		t.Fatalf("revoked token: %d", r.Code)
	}
}

func TestAdminTenantLifecycle(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, nil)
	token := b.admin(t, "alice")

	r := b.adminCall(t, token, http.MethodPost, "/v1/admin/tenants", map[string]any{
		"id": "acme", "tokens_capacity": 5000, "tokens_per_second": "2.5", "requests_capacity": 60, "requests_per_second": 1,
		"max_concurrent": 4, "period_budget": 100000, "period": "month"})
	if r.Code != http.StatusCreated {
		t.Fatalf("create: %d %s", r.Code, r.Body)
	}
	var tj tenantJSON
	r.json(&tj)
	if tj.Tenant != "acme" || tj.Limits.TokensPerSecond != "2.5" || *tj.Limits.MaxConcurrent != 4 || *tj.Limits.Period != "month" {
		t.Fatalf("created: %s", r.Body)
	}
	if r := b.adminCall(t, token, http.MethodPost, "/v1/admin/tenants", map[string]any{"id": "acme", "tokens_capacity": 1, "tokens_per_second": 1}); r.Code != http.StatusConflict {
		t.Fatalf("duplicate: %d", r.Code)
	}
	for _, bad := range []struct {
		body  string
		field string
	}{
		{`{"id":"Bad Id","tokens_capacity":1,"tokens_per_second":1}`, "id"},
		{`{"id":"x","tokens_capacity":0,"tokens_per_second":1}`, "tokens_capacity"},
		{`{"id":"x","tokens_capacity":10,"tokens_per_second":"fast"}`, "tokens_per_second"},
		{`{"id":"x","tokens_capacity":10,"tokens_per_second":1,"tokens_capacty":5}`, "tokens_capacty"},
		{`{"id":"x","tokens_capacity":"10","tokens_per_second":1}`, "tokens_capacity"},
		{`{"id":"x","tokens_capacity":10,"tokens_per_second":1,"period_budget":5}`, "period"},
	} {
		r := b.adminCall(t, token, http.MethodPost, "/v1/admin/tenants", bad.body)
		if r.Code != http.StatusBadRequest || r.errorBody().Error.Field != bad.field {
			t.Fatalf("%s: %d %s", bad.body, r.Code, r.Body)
		}
	}

	// Partial update: null removes optional limits, absent ones are kept.
	r = b.adminCall(t, token, http.MethodPatch, "/v1/admin/tenants/acme/limits", `{"tokens_capacity":3000,"requests_capacity":null,"requests_per_second":null,"period_budget":null,"period":null}`)
	if r.Code != http.StatusOK {
		t.Fatalf("patch: %d %s", r.Code, r.Body)
	}
	r.json(&tj)
	if tj.Limits.TokensCapacity != 3000 || tj.Limits.RequestsCapacity != nil || tj.Limits.PeriodBudget != nil || *tj.Limits.MaxConcurrent != 4 || tj.Balances.Tokens != "3000" {
		t.Fatalf("patched: %s", r.Body)
	}
	if r := b.adminCall(t, token, http.MethodPatch, "/v1/admin/tenants/nobody/limits", `{"tokens_capacity":3}`); r.Code != http.StatusNotFound {
		t.Fatalf("patch unknown tenant: %d", r.Code)
	}

	// Keys: created with the secret once; listed without it.
	r = b.adminCall(t, token, http.MethodPost, "/v1/admin/tenants/acme/keys", nil)
	var created struct {
		ID     string `json:"id"`
		Secret string `json:"secret"`
	}
	r.json(&created)
	if r.Code != http.StatusCreated || !strings.HasPrefix(created.Secret, "tg_") {
		t.Fatalf("key create: %d %s", r.Code, r.Body)
	}
	if list := b.adminCall(t, token, http.MethodGet, "/v1/admin/tenants/acme/keys", nil); list.Code != 200 || strings.Contains(list.Body.String(), created.Secret[len(created.Secret)-30:]) || !strings.Contains(list.Body.String(), created.ID) {
		t.Fatalf("key list: %d %s", list.Code, list.Body)
	}
	if r := b.call(t, created.Secret, http.MethodPost, "/v1/admissions", chat(10, "x")); r.Code != http.StatusCreated {
		t.Fatalf("admission with the new key: %d %s", r.Code, r.Body)
	}

	// Adjustments need a reason.
	if r := b.adminCall(t, token, http.MethodPost, "/v1/admin/tenants/acme/adjustments", `{"tokens":500}`); r.Code != 400 || r.errorBody().Error.Field != "reason" {
		t.Fatalf("adjust without reason: %d %s", r.Code, r.Body)
	}
	if r := b.adminCall(t, token, http.MethodPost, "/v1/admin/tenants/acme/adjustments", `{"tokens":-500,"reason":"refund dispute #42"}`); r.Code != 200 {
		t.Fatalf("adjust: %d %s", r.Code, r.Body)
	}

	// Disable: the tenant's requests answer 403; enable restores them.
	if r := b.adminCall(t, token, http.MethodPost, "/v1/admin/tenants/acme/disable", `{"reason":"unpaid invoice"}`); r.Code != 200 {
		t.Fatalf("disable: %d %s", r.Code, r.Body)
	}
	if r := b.call(t, created.Secret, http.MethodPost, "/v1/admissions", chat(10, "x")); r.Code != http.StatusForbidden || r.errorBody().Error.Type != "tenant_disabled" {
		t.Fatalf("disabled tenant: %d %s", r.Code, r.Body)
	}
	if r := b.adminCall(t, token, http.MethodPost, "/v1/admin/tenants/acme/enable", nil); r.Code != 200 {
		t.Fatalf("enable: %d %s", r.Code, r.Body)
	}
	if r := b.call(t, created.Secret, http.MethodPost, "/v1/admissions", chat(10, "x")); r.Code != http.StatusCreated {
		t.Fatalf("after enable: %d %s", r.Code, r.Body)
	}
	if r := b.adminCall(t, token, http.MethodDelete, "/v1/admin/tenants/acme/keys/"+created.ID, nil); r.Code != http.StatusNoContent {
		t.Fatalf("revoke: %d %s", r.Code, r.Body)
	}
	if r := b.call(t, created.Secret, http.MethodPost, "/v1/admissions", chat(10, "x")); r.Code != http.StatusUnauthorized {
		t.Fatalf("revoked key: %d", r.Code)
	}

	// Every change is in the ledger, with the admin's name as actor.
	var led struct {
		Entries []struct {
			Kind   string          `json:"kind"`
			Actor  string          `json:"actor"`
			Reason string          `json:"reason"`
			Delta  json.Number     `json:"delta"`
			Detail json.RawMessage `json:"detail"`
		} `json:"entries"`
	}
	b.adminCall(t, token, http.MethodGet, "/v1/admin/ledger?tenant=acme&order=oldest", nil).json(&led)
	var kinds []string
	for _, e := range led.Entries {
		kinds = append(kinds, e.Kind+"/"+e.Actor+"/"+e.Reason)
	}
	got := strings.Join(kinds, " | ")
	want := "tenant/admin:alice/created | limits/admin:alice/ | tenant/admin:alice/key created: " + created.ID +
		" | reserve/key:" + created.ID + "/ | adjust/admin:alice/refund dispute #42 | tenant/admin:alice/disabled: unpaid invoice" +
		" | tenant/admin:alice/enabled | reserve/key:" + created.ID + "/ | tenant/admin:alice/key revoked: " + created.ID
	if got != want {
		t.Fatalf("ledger kinds/actors/reasons:\n got %s\nwant %s", got, want)
	}
	if led.Entries[4].Delta != "-500" || !bytes.Contains(led.Entries[1].Detail, []byte(`"before"`)) {
		t.Fatalf("entries: %+v", led.Entries)
	}
}

func TestAdminLimitChangeReachesOtherReplica(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, nil)
	// A second replica on the same database.
	other, _ := newServer(t, &testConfig{replicaConfig: replica.Config{DB: pgtestPool(t, b)}})
	key := b.tenant(t, "acme", lim(10_000, "1"))
	token := b.admin(t, "ops")
	if r := b.adminCall(t, token, http.MethodPatch, "/v1/admin/tenants/acme/limits", `{"tokens_capacity":100}`); r.Code != 200 {
		t.Fatal(r.Body)
	}
	req := httptest.NewRequest(http.MethodPost, "/v1/admissions", strings.NewReader(chat(200, "x")))
	req.Header.Set("Authorization", "Bearer "+key)
	rec := httptest.NewRecorder()
	other.ServeHTTP(rec, req)
	if rec.Code != http.StatusUnprocessableEntity {
		t.Fatalf("the other replica's next admission: %d %s, want 422 under the new capacity", rec.Code, rec.Body)
	}
}

func TestAdminModels(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, nil)
	token := b.admin(t, "ops")
	key := b.tenant(t, "acme", lim(1_000_000, "1"))

	var list struct {
		Models []struct {
			Name        string      `json:"name"`
			InputWeight json.Number `json:"input_weight"`
			Source      string      `json:"source"`
		} `json:"models"`
	}
	b.adminCall(t, token, http.MethodGet, "/v1/admin/models", nil).json(&list)
	if len(list.Models) < 11 {
		t.Fatalf("seeded models: %+v", list.Models)
	}
	r := b.adminCall(t, token, http.MethodPost, "/v1/admin/models", `{"name":"acme-llm","encoding":"cl100k_base","input_weight":"0.5","output_weight":2,"default_output_tokens":1000,"context_window":8000}`)
	if r.Code != http.StatusCreated {
		t.Fatalf("create model: %d %s", r.Code, r.Body)
	}
	if r := b.adminCall(t, token, http.MethodPost, "/v1/admin/models", `{"name":"acme-llm"}`); r.Code != http.StatusConflict {
		t.Fatalf("duplicate model: %d", r.Code)
	}
	for _, bad := range []struct{ body, field string }{
		{`{"name":"m2","encoding":"p50k"}`, "encoding"},
		{`{"name":"m2","input_weight":0}`, "input_weight"},
		{`{"name":"m2","context_window":-1}`, "context_window"},
		{`{"encoding":"cl100k_base"}`, "name"},
	} {
		if r := b.adminCall(t, token, http.MethodPost, "/v1/admin/models", bad.body); r.Code != 400 || r.errorBody().Error.Field != bad.field {
			t.Fatalf("%s: %d %s", bad.body, r.Code, r.Body)
		}
	}
	// The new model prices requests now, dated variants included:
	// "hello" is 1 token; +3 +1 framing +3 priming = 8 input; 100 output.
	// cost = ceil(8 x 0.5 + 100 x 2) = 204.
	res := b.call(t, key, http.MethodPost, "/v1/estimate", `{"model":"acme-llm-2026-01-01","messages":[{"role":"user","content":"hello"}],"max_tokens":100}`)
	var est struct {
		Family   string `json:"family"`
		Estimate struct {
			InputTokens int64 `json:"input_tokens"`
			Cost        int64 `json:"cost"`
		} `json:"estimate"`
	}
	res.json(&est)
	if est.Family != "acme-llm" || est.Estimate.InputTokens != 8 || est.Estimate.Cost != 204 {
		t.Fatalf("estimate with the new model: %s", res.Body)
	}
	// A seeded model can be re-weighted.
	if r := b.adminCall(t, token, http.MethodPatch, "/v1/admin/models/gpt-4o", `{"output_weight":"4"}`); r.Code != 200 {
		t.Fatalf("patch gpt-4o: %d %s", r.Code, r.Body)
	}
	res = b.call(t, key, http.MethodPost, "/v1/estimate", `{"model":"gpt-4o","messages":[{"role":"user","content":"hello"}],"max_tokens":100}`)
	res.json(&est)
	if est.Estimate.Cost != 8+400 {
		t.Fatalf("re-weighted gpt-4o: %s", res.Body)
	}
	if r := b.adminCall(t, token, http.MethodPatch, "/v1/admin/models/nope", `{"output_weight":"4"}`); r.Code != http.StatusNotFound {
		t.Fatalf("patch unknown model: %d", r.Code)
	}
	// Another replica picks the change up at its next refresh.
	other := estimator.New(nil)
	refresh := &estimator.Refresh{Estimator: other, DB: b.pool}
	if err := refresh.Once(ctx); err != nil {
		t.Fatal(err)
	}
	if m, ok := other.Table().Get("gpt-4o"); !ok || m.OutputWeightMicro != 4*estimator.WeightOne {
		t.Fatalf("other replica's gpt-4o: %+v", m)
	}
	// A Claude model's cache write weights: seeded at Anthropic's prices
	// (1.25 and 2), changed and cleared like the cached input weight.
	var claude struct {
		CachedInputWeight  *json.Number `json:"cached_input_weight"`
		CacheWriteWeight   *json.Number `json:"cache_write_weight"`
		CacheWrite1hWeight *json.Number `json:"cache_write_1h_weight"`
	}
	r = b.adminCall(t, token, http.MethodPatch, "/v1/admin/models/claude-sonnet-4-5", `{"cache_write_weight":"1.5"}`)
	r.json(&claude)
	if r.Code != 200 || claude.CachedInputWeight == nil || *claude.CachedInputWeight != "0.1" || claude.CacheWriteWeight == nil ||
		*claude.CacheWriteWeight != "1.5" || claude.CacheWrite1hWeight == nil || *claude.CacheWrite1hWeight != "2" {
		t.Fatalf("patch claude-sonnet-4-5: %d %s", r.Code, r.Body)
	}
	if m, _ := b.rep.Estimator.Table().Lookup("claude-sonnet-4-5-20250929"); m.CacheWriteWeightMicro != 1_500_000 || m.CacheWrite1hWeightMicro != 2_000_000 {
		t.Fatalf("this replica's claude-sonnet-4-5: %+v", m)
	}
	r = b.adminCall(t, token, http.MethodPatch, "/v1/admin/models/claude-sonnet-4-5", `{"cache_write_1h_weight":null}`)
	claude.CacheWrite1hWeight = nil
	r.json(&claude)
	if r.Code != 200 || claude.CacheWrite1hWeight != nil || *claude.CacheWriteWeight != "1.5" {
		t.Fatalf("clear the 1 h weight: %d %s", r.Code, r.Body)
	}
	if r := b.adminCall(t, token, http.MethodPatch, "/v1/admin/models/claude-sonnet-4-5", `{"cache_write_weight":"-1"}`); r.Code != 400 || r.errorBody().Error.Field != "cache_write_weight" {
		t.Fatalf("negative cache write weight: %d %s", r.Code, r.Body)
	}
}

func TestAdminLedgerPagingAndExport(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, nil)
	token := b.admin(t, "ops")
	key := b.tenant(t, "acme", lim(1_000_000, "1"))
	b.tenant(t, "globex", lim(1_000_000, "1"))
	for range 25 {
		if r := b.call(t, key, http.MethodPost, "/v1/admissions", chat(10, "x")); r.Code != 201 {
			t.Fatal(r.Body)
		}
	}
	seen := map[int64]bool{}
	cursor := ""
	pages := 0
	for {
		path := "/v1/admin/ledger?tenant=acme&kind=reserve&limit=10"
		if cursor != "" {
			path += "&cursor=" + cursor
		}
		var page struct {
			Entries []struct {
				TenantID string `json:"tenant_id"`
				Seq      int64  `json:"seq"`
				Kind     string `json:"kind"`
			} `json:"entries"`
			NextCursor *string `json:"next_cursor"`
		}
		r := b.adminCall(t, token, http.MethodGet, path, nil)
		r.json(&page)
		pages++
		for _, e := range page.Entries {
			if e.TenantID != "acme" || e.Kind != "reserve" || seen[e.Seq] {
				t.Fatalf("page %d: unexpected or repeated entry %+v", pages, e)
			}
			seen[e.Seq] = true
		}
		// Inserts between pages do not shift the pages after the cursor.
		if pages == 1 {
			b.call(t, key, http.MethodPost, "/v1/admissions", chat(10, "x"))
		}
		if page.NextCursor == nil {
			break
		}
		cursor = *page.NextCursor
	}
	if len(seen) != 25 || pages != 3 {
		t.Fatalf("%d entries over %d pages, want the 25 that existed at the start over 3", len(seen), pages)
	}
	for _, q := range []string{"kind=nonsense", "from=yesterday", "cursor=bm90LWEtY3Vyc29y", "limit=0"} {
		if r := b.adminCall(t, token, http.MethodGet, "/v1/admin/ledger?"+q, nil); r.Code != 400 {
			t.Fatalf("%s: %d", q, r.Code)
		}
	}

	r := b.adminCall(t, token, http.MethodGet, "/v1/admin/ledger/export?format=csv&tenant=acme", nil)
	if r.Code != 200 || !strings.HasPrefix(r.Header().Get("Content-Type"), "text/csv") {
		t.Fatalf("export: %d %v", r.Code, r.Header())
	}
	records, err := csv.NewReader(strings.NewReader(r.Body.String())).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(records) != 1+1+26 || records[0][0] != "tenant_id" || records[1][2] != "tenant" || records[1][1] != "1" || records[27][1] != "27" {
		t.Fatalf("csv: %d records, first %v", len(records), records[:2])
	}
}

// pgtestPool opens a second pool on the bundle's database, as another
// replica would.
func pgtestPool(t *testing.T, b *apiBundle) *pgxpool.Pool {
	t.Helper()
	return pgtest.Pool(t, b.pool.Config().ConnString(), nil)
}

// TestConcurrentModelCreateOneWins: admins create one model name at once
// through two replicas, whose in-memory tables cannot know of each other's
// creation. The database decides: exactly one create answers 201, every
// other 409, and the stored model is the one that was answered 201.
func TestConcurrentModelCreateOneWins(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, nil)
	token := b.admin(t, "alice")
	other, _ := newServer(t, &testConfig{replicaConfig: replica.Config{DB: b.pool}})
	replicas := []http.Handler{b.srv, other}

	const n = 16
	codes := make([]int, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			body := fmt.Sprintf(`{"name":"race-llm","output_weight":%d}`, i+1)
			req := httptest.NewRequest(http.MethodPost, "/v1/admin/models", strings.NewReader(body))
			req.RemoteAddr = "192.0.2.10:5555"
			req.Header.Set("Authorization", "Bearer "+token)
			req.Header.Set("Content-Type", "application/json")
			rec := httptest.NewRecorder()
			replicas[i%2].ServeHTTP(rec, req)
			codes[i] = rec.Code
		})
	}
	close(start)
	wg.Wait()
	winner := -1
	for i, code := range codes {
		switch code {
		case http.StatusCreated:
			if winner >= 0 {
				t.Fatalf("two creates of one name answered 201: %v", codes)
			}
			winner = i
		case http.StatusConflict:
		default:
			t.Fatalf("create %d: %d", i, code)
		}
	}
	if winner < 0 {
		t.Fatalf("no create won: %v", codes)
	}
	stored, err := estimator.ModelList(ctx, b.pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(stored) != 1 || stored[0].OutputWeightMicro != int64(winner+1)*estimator.WeightOne {
		t.Fatalf("stored %+v; the 201 went to output weight %d", stored, winner+1)
	}
}
