package web

import (
	"crypto/subtle"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/labstack/echo/v5"

	"github.com/tokengate/tokengate/budget/credential"
)

// sessionCookie holds the session's random secret; the database stores
// only its hash.
const sessionCookie = "tokengate_session"

const ctxSession = "web.session"

// sessionOf returns the session that requireSession found, or nil on the
// public pages.
func sessionOf(c *echo.Context) *credential.Session {
	s, _ := c.Get(ctxSession).(*credential.Session)
	return s
}

// lookup returns the request's live session. It returns
// credential.ErrAdminInvalid when there is none (no cookie, logged out,
// expired, or its token revoked).
func (d *Dashboard) lookup(c *echo.Context) (*credential.Session, error) {
	ck, err := c.Cookie(sessionCookie)
	if err != nil {
		return nil, credential.ErrAdminInvalid
	}
	s, err := d.admin.Session(c.Request().Context(), ck.Value)
	if err != nil {
		return nil, err
	}
	return &s, nil
}

// requireSession sends a request without a live session to the login
// page, remembering where it was going when that was a page.
func (d *Dashboard) requireSession(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c *echo.Context) error {
		s, err := d.lookup(c)
		if errors.Is(err, credential.ErrAdminInvalid) {
			to := "/login"
			if r := c.Request(); r.Method == http.MethodGet && r.URL.Path != "/" {
				to += "?next=" + url.QueryEscape(r.URL.RequestURI())
			}
			return seeOther(c, to)
		}
		if err != nil {
			return err
		}
		c.Set(ctxSession, s)
		return next(c)
	}
}

// requireSessionJSON is requireSession for the live-update endpoint, which
// a script calls: it answers 401 rather than a redirect.
func (d *Dashboard) requireSessionJSON(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c *echo.Context) error {
		s, err := d.lookup(c)
		if errors.Is(err, credential.ErrAdminInvalid) {
			return c.JSON(http.StatusUnauthorized, jsonError{Error: jsonErrorBody{Type: "unauthorized", Message: "log in again"}})
		}
		if err != nil {
			d.logger.ErrorContext(c.Request().Context(), "dashboard session lookup failed", "error", err.Error(),
				"request_id", c.Response().Header().Get(echo.HeaderXRequestID))
			return c.JSON(http.StatusInternalServerError, jsonError{Error: jsonErrorBody{Type: "internal_error", Message: "internal server error"}})
		}
		c.Set(ctxSession, s)
		return next(c)
	}
}

type jsonError struct {
	Error jsonErrorBody `json:"error"`
}

type jsonErrorBody struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}

// checkCSRF refuses a POST whose csrf field is not its session's token.
// It reads the body's field only (never the query string, which would put
// the token in URLs and logs) and compares in constant time.
func (d *Dashboard) checkCSRF(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c *echo.Context) error {
		s := sessionOf(c)
		got := c.Request().PostFormValue("csrf")
		if s == nil || got == "" || subtle.ConstantTimeCompare([]byte(got), []byte(s.CSRF)) != 1 {
			return pageErr(http.StatusForbidden,
				"This form has expired (you logged out or logged in again since it was shown) or did not come from this dashboard. Nothing was changed. Reload the page and try again.")
		}
		return next(c)
	}
}

type loginView struct {
	layout
	Next    string
	Message string
	Notice  string
}

func (d *Dashboard) loginPage(c *echo.Context) error {
	next := safeNext(c.QueryParam("next"))
	if _, err := d.lookup(c); err == nil {
		return seeOther(c, next)
	}
	v := &loginView{layout: layout{Title: "Log in"}, Next: next}
	if c.QueryParam("bye") != "" {
		v.Notice = "You are logged out."
	}
	return d.render(c, http.StatusOK, "login.html", v)
}

// login exchanges an admin token for a session. Failures spend the client
// address's allowance; once it is spent, the token is not even looked at.
func (d *Dashboard) login(c *echo.Context) error {
	ip := c.RealIP()
	next := safeNext(c.Request().PostFormValue("next"))
	v := &loginView{layout: layout{Title: "Log in"}, Next: next}
	if !d.logins.Allow(ip) {
		c.Response().Header().Set("Retry-After", strconv.Itoa(int(d.logins.RetryAfter().Seconds())))
		v.Message = "Too many failed logins from your address. Wait a minute and try again."
		return d.render(c, http.StatusTooManyRequests, "login.html", v)
	}
	presented := strings.TrimSpace(c.Request().PostFormValue("token"))
	cookie, s, err := d.admin.Login(c.Request().Context(), presented, d.ttl)
	if errors.Is(err, credential.ErrAdminInvalid) {
		d.logins.Fail(ip)
		v.Message = "That admin token is not valid, or it was revoked."
		if strings.HasPrefix(presented, credential.KeyPrefix) {
			v.Message = "That is a tenant API key (tg_…). The dashboard takes an admin token (tga_…)."
		}
		return d.render(c, http.StatusUnauthorized, "login.html", v)
	}
	if err != nil {
		return err
	}
	c.SetCookie(&http.Cookie{
		Name:     sessionCookie,
		Value:    cookie,
		Path:     "/",
		Expires:  s.ExpiresAt,
		HttpOnly: true,
		Secure:   isTLS(c),
		SameSite: http.SameSiteStrictMode,
	})
	return seeOther(c, next)
}

// logout ends the session in the database (every replica), so its cookie
// and its CSRF token stop working at once.
func (d *Dashboard) logout(c *echo.Context) error {
	if ck, err := c.Cookie(sessionCookie); err == nil {
		if err := d.admin.Logout(c.Request().Context(), ck.Value); err != nil {
			return err
		}
	}
	c.SetCookie(&http.Cookie{
		Name: sessionCookie, Value: "", Path: "/", MaxAge: -1,
		HttpOnly: true, Secure: isTLS(c), SameSite: http.SameSiteStrictMode,
	})
	return seeOther(c, "/login?bye=1")
}

// isTLS reports whether the browser reached us over HTTPS, directly or
// through a trusted proxy, so the cookie is marked Secure.
func isTLS(c *echo.Context) bool {
	return c.Request().TLS != nil || c.Scheme() == "https"
}

// safeNext keeps a post-login destination only when it is a path on this
// site, so the login form cannot redirect anywhere else.
func safeNext(next string) string {
	if next == "" || !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") || strings.ContainsAny(next, "\\\r\n\t") {
		return "/"
	}
	u, err := url.Parse(next)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil {
		return "/"
	}
	return next
}
