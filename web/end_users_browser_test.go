package web_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
)

// TestBrowserEndUsers: in Chromium, a tenant's page shows its end-user
// policy and its end users, one spent by a real admission made by the
// tenant's key over the API with a user field; an end user's link opens
// its own page, below its tenant.
func TestBrowserEndUsers(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	base := serve(t, b)
	br := startBrowser(t, base)
	key := b.tenant(t, "acme", limits(100000, "0.000001"))
	if _, err := b.store.EndUserPolicySet(ctx, account.EndUserPolicyParams{TenantID: "acme", Source: rule.SourceUser,
		Template: limits(5000, "0.000001"), MaxEndUsers: 10, IdleTTL: 24 * time.Hour, Actor: "test"}); err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest(http.MethodPost, "/v1/admissions",
		strings.NewReader(`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"max_tokens":100,"user":"alice"}`))
	req.RemoteAddr = "198.51.100.7:5000"
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	b.srv.ServeHTTP(rec, req)
	if rec.Code != http.StatusCreated {
		t.Fatalf("admission: %d %s", rec.Code, rec.Body.String())
	}
	if _, err := b.store.EndUserEnsure(ctx, "acme", "bob"); err != nil {
		t.Fatal(err)
	}
	br.login(b.adminSecret)
	br.navigate("/tenants/acme")
	br.do("the end-user section", chromedp.WaitVisible(chromedp.CSS("#end-users-section")))
	br.noViolations("tenant page")
	if p := eval[string](br, `document.getElementById('end-user-policy').textContent`); !strings.Contains(p, "user") ||
		!strings.Contains(p, "5,000 tokens") || !strings.Contains(p, "At most 10 live end users") {
		t.Fatalf("policy: %q", p)
	}
	users := br.texts(`[...document.querySelectorAll('#end-users-section tr[data-end-user] th')].map(e => e.textContent.trim())`)
	if len(users) != 2 || !slices.Contains(users, "alice") || !slices.Contains(users, "bob") {
		t.Fatalf("end users shown: %q", users)
	}
	alice := rule.EndUserTenantID("acme", "alice")
	spent := eval[string](br, `document.querySelector('#end-users-section tr[data-end-user="alice"] [data-field="tokens"]').textContent`)
	if strings.HasPrefix(spent, "5,000") {
		t.Fatalf("alice's tokens %q: the admission did not spend them", spent)
	}
	br.do("open alice's page", chromedp.Click(chromedp.CSS(`#end-users-section tr[data-end-user="alice"] a`)),
		chromedp.WaitVisible(chromedp.CSS(fmt.Sprintf(`#tenant[data-tenant=%q]`, alice))))
	br.noViolations("end user page")
	if crumbs := eval[string](br, `document.getElementById('crumbs').textContent`); !strings.Contains(crumbs, "acme") {
		t.Fatalf("crumbs %q", crumbs)
	}
}
