package web_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/api/proxy"
	"github.com/tokengate/tokengate/budget/credential"
)

// TestProxyTrafficShowsLikeDirect: an admission made through the
// OpenAI-compatible proxy and one made over the API appear alike on the
// dashboard: both in the tenant's settled chart, both reserve and settle
// entries in the ledger, the proxy's under its own actor.
func TestProxyTrafficShowsLikeDirect(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	directKey := b.tenant(t, "acme", limits(100_000, "1"))
	key, proxyKey, err := credential.KeyCreate(ctx, b.pool, "acme")
	if err != nil {
		t.Fatal(err)
	}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"c1","object":"chat.completion","created":1,"model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":3,"total_tokens":15}}`)
	}))
	defer up.Close()
	upURL, _ := url.Parse(up.URL)
	px := httptest.NewServer(proxy.New(b.rep, proxy.Config{Upstream: upURL}))
	defer px.Close()
	api := httptest.NewServer(b.srv)
	defer api.Close()
	post := func(url, key, body string) (*http.Response, string) {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		return resp, string(raw)
	}
	chat := `{"model":"gpt-4o","max_tokens":50,"messages":[{"role":"user","content":"hello"}]}`
	viaProxy, _ := post(px.URL+"/v1/chat/completions", proxyKey, chat)
	proxied := viaProxy.Header.Get("X-Tokengate-Admission")
	if viaProxy.StatusCode != http.StatusOK || proxied == "" {
		t.Fatalf("proxy: %d", viaProxy.StatusCode)
	}
	admitted, raw := post(api.URL+"/v1/admissions", directKey, chat)
	var a struct{ ID string }
	if admitted.StatusCode != http.StatusCreated || json.Unmarshal([]byte(raw), &a) != nil {
		t.Fatalf("direct: %d %s", admitted.StatusCode, raw)
	}
	direct := a.ID
	if r, _ := post(api.URL+"/v1/admissions/"+direct+"/settle", directKey, `{"usage":{"prompt_tokens":12,"completion_tokens":3}}`); r.StatusCode != http.StatusOK {
		t.Fatalf("settle: %d", r.StatusCode)
	}

	c := b.client(t, "192.0.2.40")
	c.mustLogin()
	page := c.get("/tenants/acme").Body.String()
	if !strings.Contains(page, "The last 2 settled admissions") {
		t.Error("the tenant's chart does not count both settled admissions")
	}
	for _, id := range []string{proxied, direct} {
		ledger := c.get("/ledger?admission=" + id).Body.String()
		if strings.Count(ledger, `data-admission="`+id+`"`) != 2 || !strings.Contains(ledger, "kind-reserve") || !strings.Contains(ledger, "kind-settle") {
			t.Errorf("the ledger does not show %s's reserve and settle", id)
		}
	}
	byProxy := c.get("/ledger?actor=" + url.QueryEscape("proxy:key:"+key.ID)).Body.String()
	if strings.Count(byProxy, `data-admission="`+proxied+`"`) != 2 || strings.Contains(byProxy, direct) {
		t.Error("the ledger filtered by the proxy's actor does not show exactly its entries")
	}
}
