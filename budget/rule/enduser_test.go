package rule_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tokengate/tokengate/budget/rule"
)

func TestEndUserTenantIDIsATenantID(t *testing.T) {
	t.Parallel()
	for _, u := range []string{"u", "Alice@example.com", "名前", string(make([]byte, 256))} {
		id := rule.EndUserTenantID("acme", u)
		if err := rule.ValidateTenantID(id); err != nil || len(id) != 29 {
			t.Fatalf("%q -> %q: %v", u, id, err)
		}
	}
	if rule.EndUserTenantID("acme", "u") == rule.EndUserTenantID("acm", "eu") || rule.EndUserTenantID("acme", "u") == rule.EndUserTenantID("acme", "U") {
		t.Fatal("distinct pairs share an id")
	}
	for _, bad := range []string{"", string(make([]byte, 257)), "a\nb", "a\x00b", "\xff"} {
		var inv *rule.InvalidError
		if err := rule.ValidateEndUserID("user", bad); !errors.As(err, &inv) || inv.Field != "user" {
			t.Fatalf("%q: %v", bad, err)
		}
	}
	if err := rule.ValidateEndUserID("user", strings.Repeat("é", rule.MaxEndUserIDLen/2)); err != nil {
		t.Fatal(err)
	}
}

// TestCheckEndUserPolicy: each bad value is refused naming its field, and
// a header source's header comes back in net/http's canonical form.
func TestCheckEndUserPolicy(t *testing.T) {
	t.Parallel()
	tmpl := rule.Limits{TokensCapacity: 10, TokensRateMicro: rule.Micro}
	type policy struct {
		source  rule.EndUserSource
		header  string
		tmpl    rule.Limits
		max     int
		idleTTL time.Duration
	}
	good := policy{rule.SourceUser, "", tmpl, 1, time.Hour}
	for _, c := range []struct {
		field string
		edit  func(p *policy)
	}{
		{"source", func(p *policy) { p.source = "cookie" }},
		{"header", func(p *policy) { p.header = "X-User" }},
		{"header", func(p *policy) { p.source = rule.SourceHeader }},
		{"header", func(p *policy) { p.source, p.header = rule.SourceHeader, "X User" }},
		{"template.tokens_capacity", func(p *policy) { p.tmpl.TokensCapacity = 0 }},
		{"max_end_users", func(p *policy) { p.max = 0 }},
		{"max_end_users", func(p *policy) { p.max = rule.MaxEndUsersCap + 1 }},
		{"idle_ttl_s", func(p *policy) { p.idleTTL = time.Second - 1 }},
		{"idle_ttl_s", func(p *policy) { p.idleTTL = 366*24*time.Hour + 1 }},
	} {
		p := good
		c.edit(&p)
		var le *rule.LimitError
		if _, err := rule.CheckEndUserPolicy(p.source, p.header, &p.tmpl, p.max, p.idleTTL); !errors.As(err, &le) || le.Field != c.field {
			t.Errorf("want a LimitError on %s, got %v", c.field, err)
		}
	}
	for _, s := range []rule.EndUserSource{rule.SourceUser, rule.SourceSafetyIdentifier, rule.SourceMetadataUserID} {
		if h, err := rule.CheckEndUserPolicy(s, "", &tmpl, rule.MaxEndUsersCap, time.Second); err != nil || h != "" {
			t.Errorf("%s: %q %v", s, h, err)
		}
	}
	for in, want := range map[string]string{"x-end-user": "X-End-User", "X-END-USER": "X-End-User", "x_user.1": "X_user.1"} {
		if h, err := rule.CheckEndUserPolicy(rule.SourceHeader, in, &tmpl, 1, time.Hour); err != nil || h != want {
			t.Errorf("header %q: %q %v, want %q", in, h, err, want)
		}
	}
	if tmpl.ReservationTTL != rule.DefaultReservationTTL {
		t.Errorf("the template's defaults were not filled: %+v", tmpl)
	}
}

// TestResolvePolicy: the model's policy, else the tenant's, else the
// replica's, else reject.
func TestResolvePolicy(t *testing.T) {
	t.Parallel()
	const d, r, l = rule.PolicyDefault, rule.PolicyReject, rule.PolicyLocal
	for _, c := range []struct{ model, tenant, replica, want rule.Policy }{
		{d, d, d, r}, {l, r, r, l}, {d, l, r, l}, {d, d, l, l}, {r, l, l, r}, {d, r, l, r},
	} {
		if got := rule.ResolvePolicy(c.model, c.tenant, c.replica); got != c.want {
			t.Errorf("%q %q %q: %q, want %q", c.model, c.tenant, c.replica, got, c.want)
		}
	}
}
