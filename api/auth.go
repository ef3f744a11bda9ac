package api

import (
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/labstack/echo/v5"
	"golang.org/x/time/rate"

	"github.com/tokengate/tokengate/api/apikey"
)

const (
	ctxTenant = "tokengate.tenant"
	ctxKeyID  = "tokengate.key"
)

// tenantOf returns the tenant the request authenticated as. Handlers behind
// requireTenant only: the tenant comes from the credential, never from
// anything else the caller sends.
func tenantOf(c *echo.Context) string {
	id, _ := c.Get(ctxTenant).(string)
	return id
}

// bearer extracts the token of an "Authorization: Bearer ..." header.
func bearer(r *http.Request) string {
	h := r.Header.Get("Authorization")
	if len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		return strings.TrimSpace(h[7:])
	}
	return ""
}

// requireTenant authenticates a tenant API key. Traffic without a valid key
// draws on a per-IP limiter before any database lookup, so unauthenticated
// floods and key guessing cannot exhaust the service.
func (s *Server) requireTenant(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c *echo.Context) error {
		ip := c.RealIP()
		if !s.authLimiter.allowAttempt(ip) {
			return s.authThrottled()
		}
		key := bearer(c.Request())
		if key == "" {
			s.authLimiter.fail(ip)
			return apikey.ErrInvalid
		}
		tenantID, keyID, err := apikey.Authenticate(c.Request().Context(), s.db, key)
		if err != nil {
			s.authLimiter.fail(ip)
			return err
		}
		c.Set(ctxTenant, tenantID)
		c.Set(ctxKeyID, keyID)
		s.touchKey(keyID)
		return next(c)
	}
}

func (s *Server) authThrottled() error {
	ms := int64(1000)
	return &Error{Status: http.StatusTooManyRequests, Type: "rate_limit_exceeded", Limit: "auth",
		Message: "too many unauthenticated or failed requests from this address", RetryAfterMS: &ms}
}

// touchKey records a key's last use.
func (s *Server) touchKey(keyID string) {
	s.touchThrottled("key:"+keyID, func() error {
		ctx, cancel := s.backgroundContext(5 * time.Second)
		defer cancel()
		return apikey.Touch(ctx, s.db, keyID)
	})
}

// touchThrottled runs touch for a credential at most once a minute, off the
// request path, so authentication adds no write per request.
func (s *Server) touchThrottled(credential string, touch func() error) {
	now := time.Now()
	s.touchMu.Lock()
	last, seen := s.touched[credential]
	if seen && now.Sub(last) < time.Minute {
		s.touchMu.Unlock()
		return
	}
	s.touched[credential] = now
	s.touchMu.Unlock()
	s.background.Go(func() {
		if err := touch(); err != nil {
			s.logger.Warn("record credential use", "credential", credential, "error", err.Error())
		}
	})
}

// ipLimiter is a token bucket per client address for unauthenticated and
// failed-auth traffic. Addresses idle for ten minutes are forgotten.
type ipLimiter struct {
	mu      sync.Mutex
	perSec  rate.Limit
	burst   int
	clients map[string]*ipEntry
	swept   time.Time
}

type ipEntry struct {
	lim  *rate.Limiter
	seen time.Time
}

func newIPLimiter(perSecond float64, burst int) *ipLimiter {
	return &ipLimiter{perSec: rate.Limit(perSecond), burst: burst, clients: map[string]*ipEntry{}}
}

func (l *ipLimiter) entry(ip string, now time.Time) *ipEntry {
	if now.Sub(l.swept) > time.Minute {
		for k, e := range l.clients {
			if now.Sub(e.seen) > 10*time.Minute {
				delete(l.clients, k)
			}
		}
		l.swept = now
	}
	e, ok := l.clients[ip]
	if !ok {
		e = &ipEntry{lim: rate.NewLimiter(l.perSec, l.burst)}
		l.clients[ip] = e
	}
	e.seen = now
	return e
}

// allowAttempt reports whether ip still has failures to spend. It spends
// nothing: a request with a valid key costs the address nothing.
func (l *ipLimiter) allowAttempt(ip string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	return l.entry(ip, now).lim.TokensAt(now) >= 1
}

// fail spends one of ip's failures.
func (l *ipLimiter) fail(ip string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	l.entry(ip, now).lim.AllowN(now, 1)
}
