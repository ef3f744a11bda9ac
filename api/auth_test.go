package api_test

import (
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/credential"
)

// keyID is the id part of a tg_<id>_<secret> key.
func keyID(key string) string { return strings.Split(strings.TrimPrefix(key, "tg_"), "_")[0] }

// wrongSecret is key with its last character changed.
func wrongSecret(key string) string {
	last := "a"
	if strings.HasSuffix(key, "a") {
		last = "b"
	}
	return key[:len(key)-1] + last
}

// TestBadKeysBehindAGatewayLockOutNoOne: every tenant reaches the replica
// from the gateway's one address (the call helper's). 50 requests with a
// disabled tenant's key, 50 with a revoked key, 50 wrong secrets of one key
// and 50 unknown key ids leave every other tenant's key working, and the
// disabled and revoked keys are never counted as guesses.
func TestBadKeysBehindAGatewayLockOutNoOne(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, func(c *testConfig) { c.AuthFailuresPerSecond, c.AuthFailureBurst = 0.001, 5 })
	disabled := b.tenant(t, "disabled", lim(1000, "1"))
	if _, err := b.store.SetDisabled(ctx, account.SetDisabledParams{TenantID: "disabled", Disabled: true, Reason: "unpaid"}); err != nil {
		t.Fatal(err)
	}
	revoked := b.tenant(t, "revoked", lim(1000, "1"))
	if err := credential.KeyRevoke(ctx, b.pool, "revoked", keyID(revoked)); err != nil {
		t.Fatal(err)
	}
	victim := b.tenant(t, "victim", lim(1000, "1"))
	used := b.tenant(t, "used", lim(1000, "1"))
	if r := b.call(t, used, http.MethodGet, "/v1/budget", ""); r.Code != http.StatusOK { // authenticated lately
		t.Fatal(r.Body)
	}
	for range 50 {
		if r := b.call(t, disabled, http.MethodGet, "/v1/budget", ""); r.Code != http.StatusForbidden {
			t.Fatalf("disabled tenant's key: %d %s", r.Code, r.Body)
		}
		if r := b.call(t, revoked, http.MethodGet, "/v1/budget", ""); r.Code != http.StatusUnauthorized {
			t.Fatalf("revoked key: %d %s", r.Code, r.Body)
		}
	}
	fresh := b.tenant(t, "fresh", lim(1000, "1")) // never seen by this replica
	if r := b.call(t, fresh, http.MethodGet, "/v1/budget", ""); r.Code != http.StatusOK {
		t.Fatalf("after 100 disabled and revoked attempts, another tenant's new key: %d %s", r.Code, r.Body)
	}

	// Guessing the victim's secret throttles those guesses only.
	var throttled int
	for range 50 {
		switch r := b.call(t, wrongSecret(victim), http.MethodGet, "/v1/budget", ""); r.Code {
		case http.StatusTooManyRequests:
			throttled++
		case http.StatusUnauthorized:
		default:
			t.Fatalf("wrong secret: %d %s", r.Code, r.Body)
		}
	}
	if throttled != 45 {
		t.Fatalf("%d of 50 wrong secrets throttled; want all but the burst of 5", throttled)
	}
	// Unknown key ids: throttled too, after their own burst.
	throttled = 0
	for i := range 50 {
		unknown := credential.KeyPrefix + strings.Repeat(string(rune('a'+i%26)), 12) + "_" + strings.Repeat("a", 52)
		switch r := b.call(t, unknown, http.MethodGet, "/v1/budget", ""); r.Code {
		case http.StatusTooManyRequests:
			throttled++
		case http.StatusUnauthorized:
		default:
			t.Fatalf("unknown key: %d %s", r.Code, r.Body)
		}
	}
	if throttled != 45 {
		t.Fatalf("%d of 50 unknown ids throttled; want all but the burst of 5", throttled)
	}
	// Every real key still works from the same address.
	for name, key := range map[string]string{"used": used, "fresh": fresh, "victim": victim} {
		if r := b.call(t, key, http.MethodGet, "/v1/budget", ""); r.Code != http.StatusOK {
			t.Fatalf("%s's key after the floods: %d %s", name, r.Code, r.Body)
		}
	}
}

// TestTrustedProxyGivesTheClientAddress: with the gateway's range trusted,
// the limiter keys by the client address in X-Forwarded-For, so one
// client's guesses do not throttle another's; without it, the header is
// ignored, so a guesser cannot escape by inventing addresses.
func TestTrustedProxyGivesTheClientAddress(t *testing.T) {
	t.Parallel()
	_, gateway, err := net.ParseCIDR("192.0.2.0/24") // the call helper's RemoteAddr
	if err != nil {
		t.Fatal(err)
	}
	for _, trusted := range []bool{true, false} {
		b := setupAPI(t, func(c *testConfig) {
			c.AuthFailuresPerSecond, c.AuthFailureBurst = 0.001, 3
			if trusted {
				c.TrustedProxies = []*net.IPNet{gateway}
			}
		})
		key := b.tenant(t, "acme", lim(1000, "1"))
		for i := range 3 {
			if r := b.call(t, wrongSecret(key), http.MethodGet, "/v1/budget", "", "X-Forwarded-For", "203.0.113.1"); r.Code != http.StatusUnauthorized {
				t.Fatalf("trusted=%v: guess %d: %d", trusted, i, r.Code)
			}
		}
		// The guesser is throttled, whatever address it claims next.
		claimed := "203.0.113.1"
		if !trusted {
			claimed = "198.51.100.7"
		}
		if r := b.call(t, wrongSecret(key), http.MethodGet, "/v1/budget", "", "X-Forwarded-For", claimed); r.Code != http.StatusTooManyRequests {
			t.Fatalf("trusted=%v: fourth guess claiming %s: %d", trusted, claimed, r.Code)
		}
		// Another client behind the gateway guessing the same key id.
		r := b.call(t, wrongSecret(key), http.MethodGet, "/v1/budget", "", "X-Forwarded-For", "203.0.113.99")
		if trusted && r.Code != http.StatusUnauthorized {
			t.Fatalf("behind a trusted proxy, another client's first guess: %d", r.Code)
		}
		if !trusted && r.Code != http.StatusTooManyRequests {
			t.Fatalf("without trusted proxies, a claimed address escaped the limiter: %d", r.Code)
		}
	}
}

// TestRevocationIsSeenAtOnceWithoutALookup: admissions, settles and releases
// authenticate a key this replica verified lately from memory, and their
// decision checks in its own transaction that the key is live and the
// tenant enabled. So a key revoked (or a tenant disabled) elsewhere is
// refused by the very next request, with nothing debited.
func TestRevocationIsSeenAtOnceWithoutALookup(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, nil)
	key := b.tenant(t, "acme", lim(10_000, "1"))
	other := b.tenant(t, "globex", lim(10_000, "1"))
	r := b.call(t, key, http.MethodPost, "/v1/admissions", chat(10, "x"))
	if r.Code != http.StatusCreated {
		t.Fatal(r.Body)
	}
	var a admitted
	r.json(&a)
	if err := credential.KeyRevoke(ctx, b.pool, "acme", keyID(key)); err != nil {
		t.Fatal(err)
	}
	_, seq := b.balance(t, "acme")
	for _, call := range []struct{ path, body string }{
		{"/v1/admissions", chat(10, "x")},
		{"/v1/admissions/" + a.ID + "/settle", `{"usage":{"prompt_tokens":1,"completion_tokens":1}}`},
		{"/v1/admissions/" + a.ID + "/release", ""},
	} {
		if r := b.call(t, key, http.MethodPost, call.path, call.body); r.Code != http.StatusUnauthorized || r.Header().Get("WWW-Authenticate") == "" {
			t.Fatalf("%s with a revoked key: %d %s", call.path, r.Code, r.Body)
		}
	}
	if _, after := b.balance(t, "acme"); after != seq {
		t.Fatalf("a revoked key's request changed the ledger: seq %d -> %d", seq, after)
	}

	r = b.call(t, other, http.MethodPost, "/v1/admissions", chat(10, "x"))
	if r.Code != http.StatusCreated {
		t.Fatal(r.Body)
	}
	r.json(&a)
	if _, err := b.store.SetDisabled(ctx, account.SetDisabledParams{TenantID: "globex", Disabled: true, Reason: "unpaid"}); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/v1/admissions", "/v1/admissions/" + a.ID + "/release"} {
		if r := b.call(t, other, http.MethodPost, path, chat(10, "x")); r.Code != http.StatusForbidden {
			t.Fatalf("%s of a disabled tenant: %d %s", path, r.Code, r.Body)
		}
	}
}
