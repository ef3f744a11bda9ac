package api

import (
	"context"
	"errors"
	"net/http"

	"github.com/labstack/echo/v5"

	"github.com/tokengate/tokengate/budget/replica"
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
	if err := s.ready(ctx); err != nil {
		msg := err.Error()
		if errors.Is(err, replica.ErrUnreachable) {
			msg = "database unreachable"
		}
		return &Error{Status: http.StatusServiceUnavailable, Type: "not_ready", Message: msg}
	}
	return c.JSON(http.StatusOK, map[string]string{"status": "ready"})
}
