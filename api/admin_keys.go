package api

import (
	"errors"
	"net/http"

	"github.com/labstack/echo/v5"

	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/budget/rule"
)

func (s *Server) adminKeyList(c *echo.Context) error {
	keys, err := s.admin.KeyList(c.Request().Context(), c.Param("id"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]any{"keys": keys})
}

func (s *Server) adminKeyCreate(c *echo.Context) error {
	k, secret, err := s.admin.KeyCreate(c.Request().Context(), c.Param("id"), actorOf(c))
	if errors.Is(err, credential.ErrTenantNotFound) {
		return rule.ErrTenantNotFound
	}
	if err != nil {
		return err
	}
	c.Response().Header().Set("Cache-Control", "no-store")
	return c.JSON(http.StatusCreated, struct {
		credential.Key
		Secret string `json:"secret"`
		Note   string `json:"note"`
	}{k, secret, "the secret is shown once; only its SHA-256 is stored"})
}

func (s *Server) adminKeyRevoke(c *echo.Context) error {
	err := s.admin.KeyRevoke(c.Request().Context(), c.Param("id"), c.Param("key"), actorOf(c))
	if errors.Is(err, credential.ErrKeyNotFound) {
		return &Error{Status: http.StatusNotFound, Type: "not_found", Message: "no such unrevoked key for this tenant"}
	}
	if err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

// adminKeyPatch changes a key's priority class among the requests waiting
// for an upstream pool.
func (s *Server) adminKeyPatch(c *echo.Context) error {
	var in struct {
		Priority string `json:"priority"`
	}
	if err := decodeStrict(c, &in); err != nil {
		return err
	}
	err := s.admin.KeySetPriority(c.Request().Context(), c.Param("id"), c.Param("key"), rule.Priority(in.Priority), actorOf(c))
	switch {
	case errors.Is(err, credential.ErrBadPriority):
		return invalid("priority", `must be "critical", "standard" or "sheddable"`)
	case errors.Is(err, credential.ErrKeyNotFound):
		return &Error{Status: http.StatusNotFound, Type: "not_found", Message: "no such unrevoked key for this tenant"}
	case err != nil:
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

func (s *Server) adminTokenList(c *echo.Context) error {
	tokens, err := s.admin.AdminTokenList(c.Request().Context())
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]any{"tokens": tokens})
}

func (s *Server) adminTokenRevoke(c *echo.Context) error {
	err := s.admin.AdminTokenRevoke(c.Request().Context(), c.Param("id"))
	if errors.Is(err, credential.ErrAdminNotFound) {
		return &Error{Status: http.StatusNotFound, Type: "not_found", Message: "no such unrevoked admin token"}
	}
	if err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}
