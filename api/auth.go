package api

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/labstack/echo/v5"

	"github.com/tokengate/tokengate/api/apikey"
	"github.com/tokengate/tokengate/budget"
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
		if !s.authLimiter.Allow(ip) {
			return s.authThrottled()
		}
		key := bearer(c.Request())
		if key == "" {
			s.authLimiter.Fail(ip)
			return apikey.ErrInvalid
		}
		var tenantID, keyID string
		err := budget.ErrUnavailable
		if !s.storeDown() { // while it is down, do not wait on it for every request
			actx, cancel := s.storeContext(c.Request().Context())
			tenantID, keyID, err = apikey.Authenticate(actx, s.db, key)
			cancel()
		}
		switch {
		case errors.Is(err, apikey.ErrInvalid), errors.Is(err, apikey.ErrTenantDisabled):
			s.authLimiter.Fail(ip)
			return err
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
