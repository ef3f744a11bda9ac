package web_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/tokengate/tokengate/budget/credential"
)

// TestBrowserModelScopes: in Chromium, an admin sets a tenant's allowed
// models on its page, creates a key limited to fewer, and changes that
// key's list in its row; each is stored as typed (trimmed, in order), a
// bad entry is refused with the reason and changes nothing, and the page
// shows what is in effect.
func TestBrowserModelScopes(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	base := serve(t, b)
	br := startBrowser(t, base)
	b.tenant(t, "acme", limits(1000, "1"))
	br.login(b.adminSecret)
	br.navigate("/tenants/acme")

	br.do("save the tenant's models",
		chromedp.SetValue(chromedp.CSS("#tenant-models"), "gpt-4o*, claude-*"),
		submit(`#models-form button[type="submit"]`))
	br.flash("Model scope saved.")
	s, err := b.store.TenantSnapshot(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(s.Models, []string{"gpt-4o*", "claude-*"}) {
		t.Fatalf("the tenant's models: %q", s.Models)
	}
	if got := br.texts(`[document.querySelector('#models-current').textContent]`)[0]; !strings.Contains(got, "gpt-4o*, claude-*") {
		t.Fatalf("the page shows %q", got)
	}

	br.do("create a key for gpt-4o-mini",
		chromedp.SetValue(chromedp.CSS("#new-key-models"), "gpt-4o-mini"),
		submit(`#create-key button[type="submit"]`))
	keys, err := credential.KeyList(ctx, b.pool, "acme")
	if err != nil {
		t.Fatal(err)
	}
	k := keys[len(keys)-1]
	if !slices.Equal(k.Models, []string{"gpt-4o-mini"}) {
		t.Fatalf("the new key's models: %q", k.Models)
	}
	br.navigate("/tenants/acme")
	row := `tr[data-key="` + k.ID + `"]`
	br.do("widen the key to claude-*",
		chromedp.SetValue(chromedp.CSS(row+` .key-models input[name="models"]`), "gpt-4o-mini claude-*"),
		submit(row+` .key-models button[type="submit"]`))
	br.flash("Model scope saved.")
	keys, _ = credential.KeyList(ctx, b.pool, "acme")
	if !slices.Equal(keys[len(keys)-1].Models, []string{"gpt-4o-mini", "claude-*"}) {
		t.Fatalf("the key's models: %q", keys[len(keys)-1].Models)
	}

	long := strings.Repeat("m", 201)
	br.do("a model name too long",
		chromedp.SetValue(chromedp.CSS("#tenant-models"), long),
		submit(`#models-form button[type="submit"]`))
	if got := br.texts(`[document.body.textContent]`)[0]; !strings.Contains(got, "longer than 200 characters") {
		t.Fatalf("a refused list: the page says %.300q", got)
	}
	if s2, _ := b.store.TenantSnapshot(ctx, "acme"); !slices.Equal(s2.Models, s.Models) {
		t.Fatalf("a refused list changed the models to %q", s2.Models)
	}
	br.noViolations("the tenant page")
}
