package alert_test

import (
	"crypto/tls"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/alert"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/integration/pgtest"
)

// counter is a receiver that counts what reaches it.
type counter struct{ n atomic.Int64 }

func (c *counter) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	c.n.Add(1)
	w.WriteHeader(http.StatusNoContent)
}

// lastAttempt is the single event's last attempt, with the event.
func lastAttempt(t *testing.T, s *alert.Store) (alert.Event, alert.Attempt) {
	t.Helper()
	es := events(t, s, "acme")
	if len(es) != 1 || len(es[0].Log) == 0 {
		t.Fatalf("events: %+v", es)
	}
	return es[0], es[0].Log[len(es[0].Log)-1]
}

// TestRedirectIsNotFollowed: an https endpoint answers 307 to an http://
// address. The dispatcher does not follow it, even on a replica that
// allows http:// and private addresses: the attempt is recorded failed
// with the status and the Location, the event stays pending, and the
// redirect's target never receives the signed body.
func TestRedirectIsNotFollowed(t *testing.T) {
	t.Parallel()
	pool := pgtest.New(t, nil)
	target := &counter{}
	plain := httptest.NewServer(target)
	defer plain.Close()
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, plain.URL+"/steal", http.StatusTemporaryRedirect)
	}))
	defer srv.Close()
	s, _ := outbox(t, pool, srv.URL+"/hook", 1)
	s.AllowHTTP = true
	d := &alert.Dispatcher{Store: s, Replica: "r1", Client: srv.Client()}
	if n, err := d.Once(ctx); err != nil || n != 0 {
		t.Fatalf("once: %d delivered, %v", n, err)
	}
	ev, a := lastAttempt(t, s)
	if ev.State != "pending" || a.Outcome != "failed" || a.StatusCode == nil || *a.StatusCode != http.StatusTemporaryRedirect ||
		!strings.Contains(deref(a.Error), plain.URL+"/steal") || !strings.Contains(deref(a.Error), "not followed") {
		t.Fatalf("event %s, attempt %+v (error %q)", ev.State, a, deref(a.Error))
	}
	if n := target.n.Load(); n != 0 {
		t.Fatalf("the redirect's target received %d requests", n)
	}
}

// TestHTTPEndpointNeedsThisReplicasFlag: an http:// endpoint created where
// http:// was allowed is not sent by a replica without --alert-allow-http:
// each attempt is recorded failed, saying why, and nothing reaches the
// receiver. A replica that allows http:// delivers it.
func TestHTTPEndpointNeedsThisReplicasFlag(t *testing.T) {
	t.Parallel()
	pool := pgtest.New(t, nil)
	rc := &counter{}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	if _, _, err := alert.NewStore(pool, testKey).CreateEndpoint(ctx, srv.URL, ""); err == nil {
		t.Fatal("an http:// endpoint was created without AllowHTTP")
	}
	creator := alert.NewStore(pool, testKey)
	creator.Policy = alert.Policy{AllowHTTP: true, AllowPrivate: true}
	if _, err := account.NewStore(pool).CreateTenant(ctx, account.CreateTenantParams{ID: "acme", Limits: rule.Limits{TokensCapacity: 10, TokensRateMicro: 1}}); err != nil {
		t.Fatal(err)
	}
	ep, _, err := creator.CreateEndpoint(ctx, srv.URL+"/hook", "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := creator.CreateRule(ctx, alert.RuleParams{TenantID: "acme", EndpointID: ep.ID, Kind: alert.KindInvariant}); err != nil {
		t.Fatal(err)
	}
	if _, err := creator.RaiseInvariant(ctx, "acme", 1, "wrong"); err != nil {
		t.Fatal(err)
	}

	strict := alert.NewStore(pool, testKey)
	strict.AllowPrivate = true
	d := &alert.Dispatcher{Store: strict, Replica: "strict", Base: time.Nanosecond}
	if n, err := d.Once(ctx); err != nil || n != 0 {
		t.Fatalf("strict replica: %d delivered, %v", n, err)
	}
	ev, a := lastAttempt(t, strict)
	if ev.State != "pending" || a.Outcome != "failed" || a.StatusCode != nil || !strings.Contains(deref(a.Error), "--alert-allow-http") {
		t.Fatalf("event %s, attempt %+v (error %q)", ev.State, a, deref(a.Error))
	}
	if n := rc.n.Load(); n != 0 {
		t.Fatalf("the receiver got %d requests from a replica without --alert-allow-http", n)
	}

	loose := &alert.Dispatcher{Store: creator, Replica: "loose"}
	if n, err := loose.Once(ctx); err != nil || n != 1 {
		t.Fatalf("replica with --alert-allow-http: %d delivered, %v", n, err)
	}
	if n := rc.n.Load(); n != 1 {
		t.Fatalf("the receiver got %d requests", n)
	}
}

// TestPrivateAddressesRefused: without AllowPrivate, an endpoint whose
// host is a non-public IP literal or a loopback name is refused at
// creation (field url), and a name that resolves to a private address is
// refused when the dispatcher connects: nothing reaches the receiver and
// the attempt says why. With AllowPrivate the same endpoint is delivered.
func TestPrivateAddressesRefused(t *testing.T) {
	t.Parallel()
	pool := pgtest.New(t, nil)
	strict := alert.NewStore(pool, testKey)
	for _, u := range []string{
		"https://127.0.0.1/hook", "https://127.8.9.10:8443/", "https://10.1.2.3/", "https://172.16.0.1/", "https://192.168.1.1/",
		"https://169.254.169.254/latest/meta-data", "https://0.0.0.0/", "https://100.64.0.1/", "https://224.0.0.1/",
		"https://255.255.255.255/", "https://[::1]/", "https://[::]/", "https://[fe80::1]/", "https://[fd00::1]/",
		"https://[::ffff:127.0.0.1]/", "https://[::a00:1]/", "https://[64:ff9b::a00:1]/", "https://localhost/", "https://api.localhost./",
	} {
		_, _, err := strict.CreateEndpoint(ctx, u, "")
		var fe *alert.FieldError
		if !errors.As(err, &fe) || fe.Field != "url" || !strings.Contains(fe.Reason, "--alert-allow-private") {
			t.Errorf("%s: %v", u, err)
		}
	}
	for _, u := range []string{"https://8.8.8.8/hook", "https://[2606:4700:4700::1111]/hook", "https://[64:ff9b::808:808]/", "https://hooks.example.com/"} {
		if _, _, err := strict.CreateEndpoint(ctx, u, ""); err != nil {
			t.Errorf("%s: %v", u, err)
		}
	}
	open := alert.NewStore(pool, testKey)
	open.AllowPrivate = true
	if _, _, err := open.CreateEndpoint(ctx, "https://10.1.2.3/hook", ""); err != nil {
		t.Fatalf("a private address with AllowPrivate: %v", err)
	}
	if _, err := pool.Exec(ctx, `UPDATE alert_endpoints SET disabled_at = now()`); err != nil {
		t.Fatal(err)
	}

	// A name, so the address is known only once resolved. The server's
	// certificate is for example.com, which the client is told to expect.
	rc := &counter{}
	srv := httptest.NewTLSServer(rc)
	defer srv.Close()
	u, _ := url.Parse(srv.URL)
	s, _ := outbox(t, pool, "https://localhost:"+u.Port()+"/hook", 1)
	client := srv.Client()
	tr := client.Transport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: tr.TLSClientConfig.RootCAs, ServerName: "example.com"}
	client.Transport = tr

	strict.Policy = alert.Policy{}
	d := &alert.Dispatcher{Store: strict, Replica: "strict", Client: client, Base: time.Nanosecond}
	if n, err := d.Once(ctx); err != nil || n != 0 {
		t.Fatalf("strict replica: %d delivered, %v", n, err)
	}
	ev, a := lastAttempt(t, s)
	if ev.State != "pending" || a.Outcome != "failed" || !strings.Contains(deref(a.Error), "not a public address") ||
		!strings.Contains(deref(a.Error), "--alert-allow-private") {
		t.Fatalf("event %s, attempt %+v (error %q)", ev.State, a, deref(a.Error))
	}
	if n := rc.n.Load(); n != 0 {
		t.Fatalf("the receiver got %d requests from a replica without --alert-allow-private", n)
	}
	// A client whose transport the dispatcher cannot check is refused too.
	odd := &alert.Dispatcher{Store: strict, Replica: "odd", Base: time.Nanosecond,
		Client: &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) { return tr.RoundTrip(r) })}}
	if n, err := odd.Once(ctx); err != nil || n != 0 {
		t.Fatalf("unchecked transport: %d delivered, %v", n, err)
	}
	if rc.n.Load() != 0 {
		t.Fatal("an unchecked transport reached the receiver")
	}

	allowed := &alert.Dispatcher{Store: s, Replica: "open", Client: client}
	if n, err := allowed.Once(ctx); err != nil || n != 1 {
		t.Fatalf("with AllowPrivate: %d delivered, %v", n, err)
	}
	if n := rc.n.Load(); n != 1 {
		t.Fatalf("the receiver got %d requests", n)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestNULIsAFieldError: text Postgres cannot store (a NUL byte, invalid
// UTF-8) is the caller's mistake, named by its field, not a store error;
// an id that holds one names nothing.
func TestNULIsAFieldError(t *testing.T) {
	t.Parallel()
	pool := pgtest.New(t, nil)
	s := alert.NewStore(pool, testKey)
	if _, err := account.NewStore(pool).CreateTenant(ctx, account.CreateTenantParams{ID: "acme", Limits: rule.Limits{TokensCapacity: 10, TokensRateMicro: 1}}); err != nil {
		t.Fatal(err)
	}
	ep, _, err := s.CreateEndpoint(ctx, "https://example.com/hook", "")
	if err != nil {
		t.Fatal(err)
	}
	field := func(err error) string {
		var fe *alert.FieldError
		if errors.As(err, &fe) {
			return fe.Field
		}
		return "not a field error: " + errString(err)
	}
	_, _, errURL := s.CreateEndpoint(ctx, "https://example.com/a\x00b", "")
	_, _, errDesc := s.CreateEndpoint(ctx, "https://example.com/hook", "pager\x00")
	_, _, errUTF8 := s.CreateEndpoint(ctx, "https://example.com/hook", "pager\xff")
	_, errTenant := s.CreateRule(ctx, alert.RuleParams{TenantID: "ac\x00me", EndpointID: ep.ID, Kind: alert.KindInvariant})
	_, errEndpoint := s.CreateRule(ctx, alert.RuleParams{TenantID: "acme", EndpointID: ep.ID + "\x00", Kind: alert.KindInvariant})
	_, errRules := s.Rules(ctx, "acme\x00")
	_, errEvents := s.Events(ctx, alert.EventFilter{TenantID: "\x00"})
	_, errEventsEp := s.Events(ctx, alert.EventFilter{EndpointID: "ep_\x00"})
	for name, c := range map[string]struct {
		err  error
		want string
	}{
		"url": {errURL, "url"}, "description": {errDesc, "description"}, "utf8": {errUTF8, "description"},
		"rule tenant": {errTenant, "tenant"}, "rule endpoint": {errEndpoint, "endpoint"}, "rules": {errRules, "tenant"},
		"events tenant": {errEvents, "tenant"}, "events endpoint": {errEventsEp, "endpoint"},
	} {
		if got := field(c.err); got != c.want {
			t.Errorf("%s: %s, want field %s", name, got, c.want)
		}
	}
	_, errRotate := s.RotateSecret(ctx, "ep_\x00")
	for name, err := range map[string]error{
		"rotate": errRotate, "disable": s.DisableEndpoint(ctx, "ep_\x00"), "redeliver": s.Redeliver(ctx, "evt_\x00"),
	} {
		if !errors.Is(err, alert.ErrNotFound) {
			t.Errorf("%s: %v, want not found", name, err)
		}
	}
}
