package alert

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"
)

// Policy is where deliveries may go. A delivery carries a tenant's
// spending, signed, to a third party: by default only over https://, only
// to public addresses, and never on to wherever the receiver redirects.
//
// Each replica applies its own policy twice: when an endpoint is created
// (its URL's scheme, and its host when that is an IP literal), and again at
// every delivery (the scheme, and every address the dispatcher connects
// to, after DNS resolution, so a name that resolves to a private address
// later is refused too). An endpoint created under a looser policy is not
// delivered by a replica with a stricter one: each such attempt is
// recorded failed, with the reason.
type Policy struct {
	// AllowHTTP accepts http:// endpoints (development, tests on one
	// host): serve --alert-allow-http.
	AllowHTTP bool
	// AllowPrivate accepts endpoints at private, loopback, link-local,
	// unspecified, multicast and other non-public addresses (a receiver
	// inside the operator's own network): serve --alert-allow-private.
	AllowPrivate bool
}

// ErrAddressRefused is what a delivery to an address the policy does not
// allow fails with (wrapped).
var ErrAddressRefused = errors.New("alert: address refused")

// nonPublic are the ranges, beyond what netip's predicates name, that are
// not one public host: shared (carrier-grade NAT), documentation,
// benchmarking, reserved, discard, site-local and the like.
var nonPublic = func() []netip.Prefix {
	var out []netip.Prefix
	for _, p := range []string{
		"0.0.0.0/8", "100.64.0.0/10", "192.0.0.0/24", "192.0.2.0/24", "192.88.99.0/24", "198.18.0.0/15",
		"198.51.100.0/24", "203.0.113.0/24", "240.0.0.0/4",
		"::/96", "64:ff9b:1::/48", "100::/64", "2001::/23", "2001:db8::/32", "2002::/16", "3fff::/20", "5f00::/16", "fec0::/10",
	} {
		out = append(out, netip.MustParsePrefix(p))
	}
	return out
}()

// nat64 is the well-known NAT64 prefix: its addresses are public or not
// as the IPv4 address they embed.
var nat64 = netip.MustParsePrefix("64:ff9b::/96")

// publicAddr reports whether a is one public unicast host.
func publicAddr(a netip.Addr) bool {
	a = a.Unmap().WithZone("")
	if nat64.Contains(a) {
		b := a.As16()
		a = netip.AddrFrom4([4]byte(b[12:]))
	}
	if !a.IsValid() || !a.IsGlobalUnicast() || a.IsPrivate() {
		return false
	}
	for _, p := range nonPublic {
		if p.Contains(a) {
			return false
		}
	}
	return true
}

// checkScheme refuses a scheme the policy does not allow.
func (p Policy) checkScheme(u *url.URL) error {
	switch {
	case u.Scheme == "https":
	case u.Scheme == "http" && p.AllowHTTP:
	default:
		return invalid("url", "must be https:// (http:// only when the server runs with --alert-allow-http)")
	}
	return nil
}

// checkHost refuses, unless private addresses are allowed, a host that is
// an IP literal of no public host, or a name that is loopback by
// definition (localhost). Other names are checked when the dispatcher
// connects, on the addresses they resolve to then.
func (p Policy) checkHost(u *url.URL) error {
	if p.AllowPrivate {
		return nil
	}
	host := strings.TrimSuffix(strings.ToLower(u.Hostname()), ".")
	if a, err := netip.ParseAddr(host); err == nil && !publicAddr(a) {
		return invalid("url", "is not a public address (private, loopback, link-local and the like are refused unless the server runs with --alert-allow-private)")
	}
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return invalid("url", "is a loopback name (refused unless the server runs with --alert-allow-private)")
	}
	return nil
}

// refusePrivate is the dispatcher's dial control: it runs on the address
// a connection is about to be made to, after resolution, so neither a
// name that resolves to a private address nor one that is rebound to it
// between two lookups gets through.
func refusePrivate(_ context.Context, _, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil || !publicAddr(ap.Addr()) {
		return &addressError{address: address}
	}
	return nil
}

// addressError is a connection the policy refused.
type addressError struct{ address string }

func (e *addressError) Error() string {
	return "not sent: " + e.address + " is not a public address, and this replica runs without --alert-allow-private"
}

func (e *addressError) Unwrap() error { return ErrAddressRefused }

// noRedirect makes a client return a redirect as the answer: a delivery
// never follows one (it could lead to http://, or to an address the
// policy refuses), and a 3xx is a failed attempt.
func noRedirect(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// baseTransport is the transport of a dispatcher whose client has none
// (http.DefaultTransport's settings, without its proxy: the address
// policy is checked on the connection itself).
var baseTransport = &http.Transport{
	ForceAttemptHTTP2:     true,
	MaxIdleConns:          100,
	IdleConnTimeout:       90 * time.Second,
	TLSHandshakeTimeout:   10 * time.Second,
	ExpectContinueTimeout: time.Second,
}

// guard returns a transport like t whose every connection is checked by
// refusePrivate. It uses no proxy: through one, the dispatcher could not
// see the address it reaches.
func guard(t *http.Transport) *http.Transport {
	g := t.Clone()
	g.Proxy = nil
	//lint:ignore SA1019 cleared, deprecated or not, so that no dial bypasses the check
	g.Dial, g.DialTLS, g.DialTLSContext = nil, nil, nil
	dialer := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second, ControlContext: refusePrivate}
	g.DialContext = dialer.DialContext
	return g
}

// storable refuses text Postgres cannot store (a NUL byte, invalid
// UTF-8): the client's mistake, answered as such, not an outage.
func storable(field, s string) error {
	switch {
	case strings.IndexByte(s, 0) >= 0:
		return invalid(field, `must not contain a NUL character (\u0000)`)
	case !utf8.ValidString(s):
		return invalid(field, "must be valid UTF-8")
	}
	return nil
}

// storableText makes text from elsewhere (a receiver's Location header,
// a transport error) fit the delivery log: valid UTF-8, no NUL, at most
// limit bytes (and an ellipsis).
func storableText(s string, limit int) string {
	s = strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
	if len(s) > limit {
		cut := limit
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "…"
	}
	return s
}
