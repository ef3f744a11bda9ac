package credential

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
)

// Health is what the Guard needs to know of the store: whether this replica
// treats it as down (then keys are checked against what it last saw, with
// no lookup), and how to say it found it down. admission.Admitter is one.
type Health interface {
	Down() bool
	MarkDown(err error)
}

// GuardConfig configures a Guard. Zero fields take defaults.
type GuardConfig struct {
	DB     DB
	Health Health // nil: the store is always tried
	// FailuresPerSecond and Burst size each bucket of the failed-auth
	// limiter. Default 5 and 20.
	FailuresPerSecond float64
	Burst             int
	// LookupTimeout bounds a key lookup. Default 3 s.
	LookupTimeout time.Duration
	Logger        *slog.Logger
}

// Guard authenticates the callers of one replica: tenant keys and admin
// tokens, behind the failed-authentication limiter, with the memory a
// replica needs to keep deciding through a store outage. Every face (the
// HTTP API, gateways) authenticates through it.
//
// The limiter's buckets: only guesses spend, and each kind of guess spends
// its own bucket, so that behind a gateway (one address for every tenant)
// one client's bad key cannot lock the others out:
//   - a missing or malformed key spends its address's "malformed" bucket (it
//     costs no lookup; the bucket only tells a broken client to back off);
//   - a well-formed key whose id does not exist spends its address's
//     "unknown" bucket, checked only for ids this replica does not know to
//     exist, so an id flood cannot lock out keys in use;
//   - a wrong secret spends the bucket of that key id from that address.
//     Once spent, a presented key is compared in memory with the stored hash
//     this replica learned from the failed lookups (no lookup at all): the
//     holder of the right secret goes on, guesses are throttled. So guessing
//     one key's secret locks out neither its holder nor any other key;
//   - a revoked key or a disabled tenant's key is not a guess (only the
//     holder of the secret gets that far) and spends nothing;
//   - admin tokens spend their address's "admin" bucket.
type Guard struct {
	db      DB
	health  Health
	limiter *Limiter
	timeout time.Duration
	logger  *slog.Logger

	mu    sync.Mutex
	auth  map[[32]byte]Principal     // keys that authenticated lately, for outages
	gws   map[[32]byte]cachedGateway // gateway credentials that authenticated lately
	known map[string]knownKey        // key ids looked up, with their stored secret hash

	touchMu    sync.Mutex
	touched    map[string]time.Time
	background sync.WaitGroup
}

// Principal is who a tenant key authenticates as.
type Principal struct {
	TenantID, KeyID string
	at              time.Time
}

type knownKey struct {
	secretHash []byte
	at         time.Time
}

// AuthCacheTTL bounds how old a key's last successful check may be for the
// key to be accepted while the store is unreachable. Revocations made during
// an outage cannot be seen until it ends.
const AuthCacheTTL = 24 * time.Hour

// ThrottledError is the limiter refusing a caller before any lookup.
type ThrottledError struct{ RetryAfter time.Duration }

func (e *ThrottledError) Error() string {
	return fmt.Sprintf("credential: too many failed attempts; retry after %s", e.RetryAfter)
}

// NewGuard returns a Guard.
func NewGuard(cfg GuardConfig) *Guard {
	if cfg.FailuresPerSecond <= 0 {
		cfg.FailuresPerSecond = 5
	}
	if cfg.Burst <= 0 {
		cfg.Burst = 20
	}
	if cfg.LookupTimeout <= 0 {
		cfg.LookupTimeout = account.DefaultStoreTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Guard{db: cfg.DB, health: cfg.Health, limiter: NewLimiter(cfg.FailuresPerSecond, cfg.Burst),
		timeout: cfg.LookupTimeout, logger: cfg.Logger, touched: map[string]time.Time{}}
}

func malformedBucket(addr string) string  { return "malformed|" + addr }
func unknownBucket(addr string) string    { return "unknown|" + addr }
func keyBucket(addr, keyID string) string { return "key|" + addr + "|" + keyID }
func adminBucket(addr string) string      { return "admin|" + addr }
func gatewayBucket(addr string) string    { return "gateway|" + addr }

func (g *Guard) throttled() error { return &ThrottledError{RetryAfter: g.limiter.RetryAfter()} }

// Tenant authenticates a presented tenant key from addr (the client
// address). It returns the Principal, or ErrKeyInvalid (wrapped by
// ErrKeyUnknown, ErrKeyWrongSecret or ErrKeyRevoked), ErrTenantDisabled, a
// *ThrottledError, or rule.ErrUnavailable when the store cannot be asked
// and this replica never saw the key succeed.
func (g *Guard) Tenant(ctx context.Context, addr, presented string) (Principal, error) {
	id, secret, wellFormed := Parse(KeyPrefix, presented)
	if !wellFormed {
		if !g.limiter.Allow(malformedBucket(addr)) {
			return Principal{}, g.throttled()
		}
		g.limiter.Fail(malformedBucket(addr))
		return Principal{}, ErrKeyInvalid
	}
	stored, known := g.knownKey(id)
	switch {
	case !known && !g.limiter.Allow(unknownBucket(addr)):
		return Principal{}, g.throttled()
	case !g.limiter.Allow(keyBucket(addr, id)) && !(known && Equal(stored, secret)):
		return Principal{}, g.throttled()
	}
	var checked KeyChecked
	err := rule.ErrUnavailable
	if g.health == nil || !g.health.Down() { // while it is down, do not wait on it for every request
		lctx, cancel := context.WithTimeout(ctx, g.timeout)
		checked, err = KeyCheck(lctx, g.db, presented)
		cancel()
		if checked.SecretHash != nil {
			g.rememberKey(id, checked.SecretHash)
		}
	}
	switch {
	case errors.Is(err, ErrKeyUnknown):
		g.limiter.Fail(unknownBucket(addr))
		return Principal{}, err
	case errors.Is(err, ErrKeyWrongSecret):
		g.limiter.Fail(keyBucket(addr, id))
		return Principal{}, err
	case errors.Is(err, ErrKeyInvalid), errors.Is(err, ErrTenantDisabled):
		return Principal{}, err // revoked, or its tenant disabled: not a guess
	case err != nil:
		// The store did not answer: a key this replica checked lately is
		// still good, so the failure policy can decide.
		if p, ok := g.cached(presented); ok {
			return p, nil
		}
		if g.health != nil && !errors.Is(err, context.Canceled) {
			g.health.MarkDown(err)
		}
		return Principal{}, fmt.Errorf("%w: %v", rule.ErrUnavailable, err)
	}
	p := Principal{TenantID: checked.TenantID, KeyID: checked.KeyID, at: time.Now()}
	g.remember(presented, p)
	g.touch("key:"+p.KeyID, func(ctx context.Context) error { return KeyTouch(ctx, g.db, p.KeyID) })
	return p, nil
}

// TenantDeferred is Tenant for requests whose decision checks the key
// itself (account.ReserveParams.KeyID and the like): a key whose secret this
// replica verified within AuthCacheTTL is answered from memory, with no
// lookup, because what could have changed since (revocation, the tenant
// disabled) is checked in the decision's own transaction. A key's id, its
// secret's hash and its tenant never change. Other keys go through Tenant.
func (g *Guard) TenantDeferred(ctx context.Context, addr, presented string) (Principal, error) {
	if g.health == nil || !g.health.Down() {
		if p, ok := g.cached(presented); ok {
			g.touch("key:"+p.KeyID, func(ctx context.Context) error { return KeyTouch(ctx, g.db, p.KeyID) })
			return p, nil
		}
	}
	return g.Tenant(ctx, addr, presented)
}

// Gateway authenticates a presented gateway credential from addr (looked
// up on every call: a revocation applies at once). It returns
// ErrGatewayInvalid or a *ThrottledError.
func (g *Guard) Gateway(ctx context.Context, addr, presented string) (Gateway, error) {
	if !g.limiter.Allow(gatewayBucket(addr)) {
		return Gateway{}, g.throttled()
	}
	lctx, cancel := context.WithTimeout(ctx, g.timeout)
	gw, err := GatewayAuthenticate(lctx, g.db, presented)
	cancel()
	switch {
	case errors.Is(err, ErrGatewayInvalid):
		g.limiter.Fail(gatewayBucket(addr))
	case err == nil:
		g.rememberGateway(presented, gw)
	}
	return gw, err
}

// GatewayDeferred is Gateway for calls whose decision checks the gateway
// itself (account.ReserveParams.GatewayID and the like): a credential whose
// secret this replica verified within AuthCacheTTL is answered from
// memory, with no lookup, because what could have changed since (its
// revocation) is checked in the decision's own transaction, in every
// replica at once. A gateway's id, secret hash, name and scope never
// change. While the store is unreachable, a credential verified lately is
// answered from memory too, so that the failure policy can decide; others
// go through Gateway.
func (g *Guard) GatewayDeferred(ctx context.Context, addr, presented string) (Gateway, error) {
	if gw, ok := g.cachedGateway(presented); ok {
		return gw, nil
	}
	gw, err := g.Gateway(ctx, addr, presented)
	var throttled *ThrottledError
	if err != nil && !errors.Is(err, ErrGatewayInvalid) && !errors.As(err, &throttled) {
		if g.health != nil && !errors.Is(err, context.Canceled) {
			g.health.MarkDown(err)
		}
		return Gateway{}, fmt.Errorf("%w: %v", rule.ErrUnavailable, err)
	}
	return gw, err
}

type cachedGateway struct {
	gw Gateway
	at time.Time
}

func (g *Guard) rememberGateway(presented string, gw Gateway) {
	h := sha256.Sum256([]byte(presented))
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.gws == nil || len(g.gws) > 10_000 {
		g.gws = map[[32]byte]cachedGateway{}
	}
	g.gws[h] = cachedGateway{gw: gw, at: time.Now()}
}

func (g *Guard) cachedGateway(presented string) (Gateway, bool) {
	h := sha256.Sum256([]byte(presented))
	g.mu.Lock()
	defer g.mu.Unlock()
	c, ok := g.gws[h]
	if !ok || time.Since(c.at) > AuthCacheTTL {
		return Gateway{}, false
	}
	return c.gw, true
}

// Admin authenticates a presented admin token from addr. It returns
// ErrAdminInvalid or a *ThrottledError.
func (g *Guard) Admin(ctx context.Context, addr, presented string) (AdminToken, error) {
	if !g.limiter.Allow(adminBucket(addr)) {
		return AdminToken{}, g.throttled()
	}
	lctx, cancel := context.WithTimeout(ctx, g.timeout)
	tok, err := AdminTokenAuthenticate(lctx, g.db, presented)
	cancel()
	if errors.Is(err, ErrAdminInvalid) {
		g.limiter.Fail(adminBucket(addr))
		return AdminToken{}, err
	}
	if err != nil {
		// The store did not answer: a 503 the admin can retry, not a 500.
		return AdminToken{}, fmt.Errorf("%w: %v", rule.ErrUnavailable, err)
	}
	g.touch("admin:"+tok.ID, func(ctx context.Context) error { return AdminTokenTouch(ctx, g.db, tok.ID) })
	return tok, nil
}

func (g *Guard) remember(key string, p Principal) {
	h := sha256.Sum256([]byte(key))
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.auth == nil || len(g.auth) > 100_000 {
		g.auth = map[[32]byte]Principal{}
	}
	g.auth[h] = p
}

func (g *Guard) cached(key string) (Principal, bool) {
	h := sha256.Sum256([]byte(key))
	g.mu.Lock()
	defer g.mu.Unlock()
	p, ok := g.auth[h]
	if !ok || time.Since(p.at) > AuthCacheTTL {
		return Principal{}, false
	}
	return p, true
}

// rememberKey records that a key with this id exists, and its stored
// secret hash, for the failed-authentication limiter.
func (g *Guard) rememberKey(id string, secretHash []byte) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.known == nil || len(g.known) > 100_000 {
		g.known = map[string]knownKey{}
	}
	g.known[id] = knownKey{secretHash: secretHash, at: time.Now()}
}

// knownKey returns the stored secret hash of a key id this replica looked
// up within AuthCacheTTL.
func (g *Guard) knownKey(id string) ([]byte, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	k, ok := g.known[id]
	if !ok || time.Since(k.at) > AuthCacheTTL {
		return nil, false
	}
	return k.secretHash, true
}

// touch records a credential's last use at most once a minute, off the
// request path, so authentication adds no write per request.
func (g *Guard) touch(credential string, write func(context.Context) error) {
	now := time.Now()
	g.touchMu.Lock()
	if last, seen := g.touched[credential]; seen && now.Sub(last) < time.Minute {
		g.touchMu.Unlock()
		return
	}
	g.touched[credential] = now
	g.touchMu.Unlock()
	g.background.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := write(ctx); err != nil {
			g.logger.Warn("record credential use", "credential", credential, "error", err.Error())
		}
	})
}

// Close waits for the last-use writes in flight.
func (g *Guard) Close() { g.background.Wait() }
