package api

import (
	"context"
	"net/http"
	"strings"

	"github.com/labstack/echo/v5"

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

// requireTenant authenticates a tenant API key through the replica's
// credential.Guard (its limiter, and its memory of keys for outages). The
// client address is the TCP peer, or, from a trusted proxy
// (Config.TrustedProxies), the nearest untrusted address in
// X-Forwarded-For.
func (s *Server) requireTenant(next echo.HandlerFunc) echo.HandlerFunc {
	return s.authenticate(next, s.guard.Tenant)
}

// requireTenantForDecision is requireTenant for the routes whose decision
// checks the key in its own transaction (KeyID in the params): a key this
// replica verified lately needs no lookup of its own.
func (s *Server) requireTenantForDecision(next echo.HandlerFunc) echo.HandlerFunc {
	return s.authenticate(next, s.guard.TenantDeferred)
}

func (s *Server) authenticate(next echo.HandlerFunc, check func(ctx context.Context, addr, key string) (credential.Principal, error)) echo.HandlerFunc {
	return func(c *echo.Context) error {
		p, err := check(c.Request().Context(), c.RealIP(), bearer(c.Request()))
		if err != nil {
			return err
		}
		c.Set(ctxTenant, p.TenantID)
		c.Set(ctxKeyID, p.KeyID)
		return next(c)
	}
}
