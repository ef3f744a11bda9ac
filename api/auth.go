package api

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/labstack/echo/v5"

	"github.com/tokengate/tokengate/budget"
	"github.com/tokengate/tokengate/budget/credential"
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

// The failed-authentication limiter's buckets. Only guesses spend, and each
// kind of guess spends its own bucket, so that behind a gateway (one address
// for every tenant) one client's bad key cannot lock the others out:
//   - a missing or malformed key spends its address's "malformed" bucket
//     (it costs no lookup; the bucket only tells a broken client to back
//     off);
//   - a well-formed key whose id does not exist spends its address's
//     "unknown" bucket, checked only for ids this replica does not know to
//     exist, so an id flood cannot lock out keys in use;
//   - a wrong secret spends the bucket of that key id from that address.
//     Once spent, a presented key is compared in memory with the stored
//     hash this replica learned from the failed lookups (no lookup at all):
//     the holder of the right secret goes on, guesses get 429. So guessing
//     one key's secret locks out neither its holder nor any other key;
//   - a revoked key or a disabled tenant's key is not a guess (only the
//     holder of the secret gets that far) and spends nothing.
func malformedBucket(addr string) string  { return "malformed|" + addr }
func unknownBucket(addr string) string    { return "unknown|" + addr }
func keyBucket(addr, keyID string) string { return "key|" + addr + "|" + keyID }
func adminBucket(addr string) string      { return "admin|" + addr }

// requireTenant authenticates a tenant API key. Failed authentication
// draws on the limiter above before any database lookup, so floods and key
// guessing cannot exhaust the service. The client address is the TCP peer,
// or, from a trusted proxy (Config.TrustedProxies), the nearest untrusted
// address in X-Forwarded-For.
func (s *Server) requireTenant(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c *echo.Context) error {
		addr := c.RealIP()
		key := bearer(c.Request())
		id, secret, wellFormed := credential.Parse(credential.KeyPrefix, key)
		if !wellFormed {
			if !s.authLimiter.Allow(malformedBucket(addr)) {
				return s.authThrottled()
			}
			s.authLimiter.Fail(malformedBucket(addr))
			return credential.ErrKeyInvalid
		}
		stored, known := s.knownKey(id)
		switch {
		case !known && !s.authLimiter.Allow(unknownBucket(addr)):
			return s.authThrottled()
		case !s.authLimiter.Allow(keyBucket(addr, id)) && !(known && credential.Equal(stored, secret)):
			return s.authThrottled()
		}
		var tenantID, keyID string
		err := budget.ErrUnavailable
		if !s.storeDown() { // while it is down, do not wait on it for every request
			actx, cancel := s.storeContext(c.Request().Context())
			var checked credential.KeyChecked
			checked, err = credential.KeyCheck(actx, s.db, key)
			cancel()
			tenantID, keyID = checked.TenantID, checked.KeyID
			if checked.SecretHash != nil {
				s.rememberKey(id, checked.SecretHash)
			}
		}
		switch {
		case errors.Is(err, credential.ErrKeyUnknown):
			s.authLimiter.Fail(unknownBucket(addr))
			return err
		case errors.Is(err, credential.ErrKeyWrongSecret):
			s.authLimiter.Fail(keyBucket(addr, id))
			return err
		case errors.Is(err, credential.ErrKeyInvalid), errors.Is(err, credential.ErrTenantDisabled):
			return err // revoked, or its tenant disabled: not a guess
		case err != nil:
			// The store did not answer: a key this replica checked lately
			// is still good, so the failure policy can decide.
			cached, ok := s.cachedAuth(key)
			if !ok {
				s.markDown(err)
				return fmt.Errorf("%w: %v", budget.ErrUnavailable, err)
			}
			tenantID, keyID = cached.tenantID, cached.keyID
		default:
			s.rememberAuth(key, tenantID, keyID)
		}
		c.Set(ctxTenant, tenantID)
		c.Set(ctxKeyID, keyID)
		s.touchKey(keyID)
		return next(c)
	}
}

func (s *Server) authThrottled() error {
	ms := s.authLimiter.RetryAfter().Milliseconds()
	return &Error{Status: http.StatusTooManyRequests, Type: "rate_limit_exceeded", Limit: "auth",
		Message: "too many unauthenticated or failed requests from this address", RetryAfterMS: &ms}
}

// touchKey records a key's last use.
func (s *Server) touchKey(keyID string) {
	s.touchThrottled("key:"+keyID, func() error {
		ctx, cancel := s.backgroundContext(5 * time.Second)
		defer cancel()
		return credential.KeyTouch(ctx, s.db, keyID)
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
