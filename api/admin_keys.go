package api

import (
	"errors"
	"net/http"

	"github.com/labstack/echo/v5"

	"github.com/tokengate/tokengate/budget/credential"
)

func (s *Server) adminKeyList(c *echo.Context) error {
	keys, err := s.admin.KeyList(c.Request().Context(), c.Param("id"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]any{"keys": keys})
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
