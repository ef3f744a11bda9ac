package api_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/budget/alert"
	"github.com/tokengate/tokengate/budget/credential"
)

// fuzzRoutes are the routes that take a body, with a valid body and a few
// that are not, as seeds. Each path is relative to a tenant "acme" (with a
// key, a pool "gpu" and a model "gpt-4o"), so a mutated body exercises the
// decoding and validation of that route, not a 404.
var fuzzRoutes = []struct {
	method, path string
	admin        bool
	seeds        []string
}{
	{"POST", "/v1/admissions", false, []string{`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`, `{"model":"gpt-4o","prompt":"x","max_wait_ms":-1}`, `{"model":"gpt-4o","input":[{"role":"user","content":"a"}],"input_tokens":1e99}`}},
	{"POST", "/v1/estimate", false, []string{`{"model":"gpt-4o","prompt":"hello"}`, `{"model":""}`}},
	{"POST", "/v1/admissions/ADM/settle", false, []string{`{"usage":{"prompt_tokens":3,"completion_tokens":4}}`, `{"usage":{"input_tokens":1,"output_tokens":2,"input_tokens_details":{"cached_tokens":5}}}`, `{"usage":{"prompt_tokens":-1}}`}},
	{"POST", "/v1/admissions/ADM/release", false, []string{``, `{}`, `{"x":1}`}},
	{"POST", "/v1/admin/tenants", true, []string{`{"id":"t1","parent":"acme","tokens_capacity":10,"tokens_per_second":"1","shadow":["tokens"]}`, `{"id":"t2","tokens_capacity":-1}`, `{"id":"x","parent":"x","tokens_capacity":1,"tokens_per_second":1}`}},
	{"PATCH", "/v1/admin/tenants/acme/limits", true, []string{`{"max_concurrent":5,"shadow":["concurrency"]}`, `{"period":"week"}`, `{"requests_capacity":null}`,
		`{"reservation_ttl_ms":288230376151771744}`, `{"max_wait_ms":9223372036854775807}`, `{"max_concurrent":0}`, `{"tokens_capacity":5}{"tokens_capacity":6}`, `{"tokens_capacity":5} x`,
		`{"windows":[{"name":"daily","unit":"day","time_zone":"Europe/Paris","reset_at":"09:00","money":"25.50","overage_percent":10,"thresholds":[50,100]}]}`,
		`{"windows":[{"name":"w","unit":"week","week_start":"friday","tokens":1000},{"name":"w","unit":"hour","reset_at":"00:30","tokens":1}]}`,
		`{"windows":[{"name":"x","unit":"month","time_zone":"Local","money":"1e3","tokens":5}]}`, `{"windows":null,"period_budget":100,"period":"day"}`,
		`{"windows":[{"name":"q","unit":"day","time_zone":"Mars/Olympus","reset_at":"24:00","tokens":-1,"thresholds":[0,1001]}]}`}},
	{"POST", "/v1/admin/tenants/acme/disable", true, []string{`{"reason":"why"}`, `{"reason":5}`}},
	{"POST", "/v1/admin/tenants/acme/adjustments", true, []string{`{"tokens":5,"reason":"gift"}`, `{"tokens":0,"reason":""}`, `{"tokens":1e30,"reason":"x"}`}},
	{"PUT", "/v1/admin/tenants/acme/model-limits", true, []string{`{"model":"gpt-4o","input_tokens_capacity":100,"input_tokens_per_second":1}`, `{"model":"a/b","output_tokens_capacity":1}`}},
	{"PATCH", "/v1/admin/tenants/acme/keys/KEY", true, []string{`{"priority":"critical"}`, `{"priority":""}`}},
	{"POST", "/v1/admin/models", true, []string{`{"name":"m1","encoding":"o200k_base","input_weight":1,"output_weight":2,"output_cap":100,"context_window":1000}`, `{"name":""}`}},
	{"PATCH", "/v1/admin/models/gpt-4o", true, []string{`{"output_weight":3}`, `{"output_weight":-3}`}},
	{"POST", "/v1/admin/pools", true, []string{`{"id":"p1","tokens_capacity":10,"tokens_per_second":1,"models":["m"]}`, `{"id":"p2"}`}},
	{"PATCH", "/v1/admin/pools/gpu/limits", true, []string{`{"tokens_capacity":10,"tokens_per_second":"0.5"}`, `{"tokens_capacity":0}`}},
	{"PUT", "/v1/admin/pools/gpu/models", true, []string{`{"model":"gpt-4o-mini"}`, `{"model":""}`}},
	{"PUT", "/v1/admin/pools/gpu/weights/acme", true, []string{`{"weight":3}`, `{"weight":0}`}},
	{"POST", "/v1/admin/alerts/endpoints", true, []string{`{"url":"https://example.com/hook","description":"d"}`, `{"url":"http://x"}`}},
	{"POST", "/v1/admin/alerts/rules", true, []string{`{"endpoint":"EP","kind":"period_budget","tenant":"acme","thresholds":[50,80]}`,
		`{"endpoint":"EP","kind":"throttled","limit":"tokens","sustain_minutes":3}`, `{"endpoint":"EP","kind":"invariant","thresholds":[1e9]}`}},
	{"POST", "/v1/admin/prices", true, []string{`{"model":"gpt-4o","input":"2.5","output":10,"cached_input":"1.25","long_context":{"threshold":200000,"input":5,"output":20}}`,
		`{"model":"m\u0000","input":1,"output":1}`, `{"model":"m","input":1e300,"output":-1}`, `{"model":"m","input":"1","output":"1","effective_from":"0000-01-01T00:00:00Z"}`,
		`{"model":"m","input":"1","output":"1","currency":"\u0000XY"}`, `{"model":"m","input":"1","output":"1","long_context":{"threshold":9223372036854775807,"input":1,"output":1}}`}},
	// End users: the policy is fuzzed on a tenant of its own ("team"), so
	// that a policy a mutated body sets never turns the admissions fuzzed
	// above into first sights of end users (a first sight creates its end
	// user even when a limit then refuses the request).
	{"PUT", "/v1/admin/tenants/team/end-user-policy", true, []string{
		`{"source":"user","template":{"tokens_capacity":1000,"tokens_per_second":"1"},"max_end_users":10,"idle_ttl_s":3600}`,
		`{"source":"header","header":"X-End-User","template":{"tokens_capacity":10,"tokens_per_second":1,"max_concurrent":2},"max_end_users":1,"idle_ttl_s":1}`,
		`{"source":"metadata.user_id","template":{"tokens_capacity":0},"max_end_users":0,"idle_ttl_s":-1}`,
		`{"source":"header","header":"bad header","template":{},"max_end_users":1,"idle_ttl_s":1}`,
		`{"source":"cookie","template":{"tokens_capacity":1,"tokens_per_second":1},"max_end_users":1,"idle_ttl_s":1}`,
		`{"source":"user","header":"X","template":{"tokens_capacity":1,"tokens_per_second":1},"max_end_users":9223372036854775807,"idle_ttl_s":1e30}`,
		`{"source":"user","template":{"tokens_capacity":1,"tokens_per_second":1,"nope":1},"max_end_users":1,"idle_ttl_s":1}`,
		`{"source":"user","template":{"tokens_capacity":1,"tokens_per_second":1},"max_end_users":1,"idle_ttl_s":1} {}`,
	}},
}

// FuzzAPIBodies sends arbitrary bodies to every route that takes one, on a
// real server over real Postgres, and checks what the brief demands of bad
// input: never a 5xx or a crash, a JSON error naming its type for every
// 4xx, and a refused request moves no balance and writes no ledger row.
// `make fuzz` runs it for a bounded time; `make test` runs the seeds.
func FuzzAPIBodies(f *testing.F) {
	for i, r := range fuzzRoutes {
		for _, s := range r.seeds {
			f.Add(uint8(i), s)
		}
	}
	// NUL bytes (refused in every stored field, kept in message content,
	// which is only counted) and data after the JSON value.
	f.Add(uint8(0), `{"model":"gpt-4o\u0000","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`)
	f.Add(uint8(0), `{"model":"gpt-4o","messages":[{"role":"user","content":"a\u0000b"}],"max_tokens":5}`)
	f.Add(uint8(0), `{"model":"gpt-4o","prompt":"x","max_tokens":5} {"model":"gpt-4o","prompt":"y"}`)
	f.Add(uint8(1), "{\"model\":\"gpt-4o\",\"prompt\":\"x\"}\x00")
	f.Add(uint8(2), `{"usage":{"prompt_tokens":3,"completion_tokens":4}}{"usage":{"prompt_tokens":1}}`)
	f.Add(uint8(4), `{"id":"t\u0000","tokens_capacity":10,"tokens_per_second":1}`)
	f.Add(uint8(5), `{"max_concurrent":5}trailing`)
	f.Add(uint8(6), `{"reason":"\u0000"}`)
	f.Add(uint8(7), `{"tokens":5,"reason":"gift\u0000"}`)
	f.Add(uint8(7), `{"tokens":5,"reason":"gift"} {"tokens":5,"reason":"again"}`)
	f.Add(uint8(8), `{"model":"gpt\u0000","input_tokens_capacity":100,"input_tokens_per_second":1}`)
	f.Add(uint8(10), `{"name":"m\u0000"}`)
	f.Add(uint8(16), `{"url":"https://example.com/hook","description":"\u0000"}`)
	// Huge and negative integers where money is computed (issue 21): usage
	// no request could produce, amounts past int64. Route 0 admits, 2
	// settles, 7 adjusts.
	f.Add(uint8(2), `{"usage":{"prompt_tokens":1000000000,"completion_tokens":1000000000}}`)
	f.Add(uint8(2), `{"usage":{"prompt_tokens":9223372036854775807,"completion_tokens":9223372036854775807}}`)
	f.Add(uint8(2), `{"usage":{"input_tokens":9223372036854775808,"output_tokens":1}}`)
	f.Add(uint8(2), `{"usage":{"prompt_tokens":1e30,"completion_tokens":1}}`)
	f.Add(uint8(2), `{"usage":{"prompt_tokens":-9223372036854775808,"completion_tokens":-1}}`)
	f.Add(uint8(2), `{"usage":{"prompt_tokens":127999,"completion_tokens":6,"prompt_tokens_details":{"cached_tokens":1000000000}}}`)
	f.Add(uint8(0), `{"model":"gpt-4o","prompt":"x","max_tokens":9223372036854775807,"input_tokens":1000000000}`)
	f.Add(uint8(7), `{"tokens":-9223372036854775808,"reason":"x"}`)
	f.Add(uint8(7), `{"tokens":9223372036854775807,"reason":"x"}`)
	f.Add(uint8(7), `{"tokens":-1000000000000,"reason":"past the debt floor"}`)
	f.Add(uint8(0), `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"max_tokens":5,"user":"alice","safety_identifier":"a\u0000"}`)
	f.Add(uint8(0), `{"model":"gpt-4o","prompt":"x","max_tokens":5,"user":42,"metadata":{"user_id":[1]}}`)
	// Service tiers (issue 38): asked for at admit, reported at settle.
	f.Add(uint8(0), `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"max_tokens":5,"service_tier":"flex"}`)
	f.Add(uint8(0), `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"max_tokens":5,"service_tier":{"x":1}}`)
	f.Add(uint8(2), `{"usage":{"prompt_tokens":3,"completion_tokens":4,"service_tier":"priority"}}`)
	f.Add(uint8(2), `{"usage":{"prompt_tokens":3,"completion_tokens":4,"service_tier":"turbo\u0000"}}`)
	b := setupAPI(f, func(c *testConfig) { c.Alerts = alert.NewStore(c.DB, []byte("0123456789abcdef0123456789abcdef")) })
	admin := b.admin(f, "ops")
	key := b.tenant(f, "acme", lim(1_000_000, "1000"))
	b.tenant(f, "team", lim(1_000_000, "1000"))
	if r := b.adminCall(f, admin, http.MethodPost, "/v1/admin/pools", `{"id":"gpu","tokens_capacity":100000,"tokens_per_second":1000}`); r.Code != http.StatusCreated {
		f.Fatal(r.Body)
	}
	var ep struct{ Endpoint struct{ ID string } }
	if r := b.adminCall(f, admin, http.MethodPost, "/v1/admin/alerts/endpoints", `{"url":"https://example.com/hook"}`); r.Code != http.StatusCreated {
		f.Fatal(r.Body)
	} else {
		r.json(&ep)
	}
	keys, err := credential.KeyList(ctx, b.pool, "acme")
	if err != nil || len(keys) != 1 {
		f.Fatal(keys, err)
	}
	var adm struct {
		ID string `json:"id"`
	}
	b.call(f, key, http.MethodPost, "/v1/admissions", `{"model":"gpt-4o","prompt":"x","max_tokens":5}`).json(&adm)
	if adm.ID == "" {
		f.Fatal("no admission to settle")
	}
	f.Fuzz(func(t *testing.T, route uint8, body string) {
		r := fuzzRoutes[int(route)%len(fuzzRoutes)]
		path := strings.NewReplacer("ADM", adm.ID, "KEY", keys[0].ID).Replace(r.path)
		body = strings.ReplaceAll(body, `"EP"`, `"`+ep.Endpoint.ID+`"`)
		before := ledgerState(t, b)
		cred := key
		if r.admin {
			cred = admin
		}
		res := b.call(t, cred, r.method, path, body)
		if res.Code >= 500 {
			t.Fatalf("%s %s %q: %d %s", r.method, path, body, res.Code, res.Body)
		}
		if res.Code < 400 {
			return
		}
		var e struct {
			Error struct {
				Type    string `json:"type"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal(res.Body.Bytes(), &e); err != nil || e.Error.Type == "" || e.Error.Message == "" {
			t.Fatalf("%s %s %q: %d with a body that is not a JSON error: %s", r.method, path, body, res.Code, res.Body)
		}
		if after := ledgerState(t, b); after != before {
			t.Fatalf("%s %s %q: refused with %d, yet the balances or the ledger moved:\n%s\n%s", r.method, path, body, res.Code, before, after)
		}
	})
}

// ledgerState is every tenant's balances and ledger head, and the number of
// ledger rows: what a refused request must leave as it was.
func ledgerState(t testing.TB, b *apiBundle) string {
	t.Helper()
	var s string
	if err := b.pool.QueryRow(ctx, `SELECT coalesce(string_agg(id || ':' || tokens_micro || ':' || open_reservations || ':' || ledger_seq, ',' ORDER BY id), '')
		|| '/' || (SELECT count(*) FROM ledger_entries) FROM tenants`).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}
