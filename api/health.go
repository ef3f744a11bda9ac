package api

import (
	"context"
	"errors"
	"net/http"

	"github.com/labstack/echo/v5"

	"github.com/tokengate/tokengate/migrations"
)

// healthz answers while the process can serve HTTP at all. It touches no
// dependency, so a database outage never gets replicas restarted.
func (s *Server) healthz(c *echo.Context) error {
	return c.JSON(http.StatusOK, map[string]string{"status": "ok"})
}

// readyz answers 200 only when this replica can make decisions: the database
// answers and its schema is the one this binary expects. Load balancers use
// it to route around a replica that would only return errors.
func (s *Server) readyz(c *echo.Context) error {
	ctx, cancel := context.WithTimeout(c.Request().Context(), s.cfg.ReadyTimeout)
	defer cancel()
	if err := s.db.Ping(ctx); err != nil {
		return &Error{Status: http.StatusServiceUnavailable, Type: "not_ready", Message: "database unreachable"}
	}
	if err := s.migrator.Check(ctx); err != nil {
		msg := "database unreachable"
		if errors.Is(err, migrations.ErrPending) {
			msg = err.Error()
		}
		return &Error{Status: http.StatusServiceUnavailable, Type: "not_ready", Message: msg}
	}
	if err := s.admitter.Ready(); err != nil {
		return &Error{Status: http.StatusServiceUnavailable, Type: "not_ready", Message: err.Error()}
	}
	return c.JSON(http.StatusOK, map[string]string{"status": "ready"})
}
