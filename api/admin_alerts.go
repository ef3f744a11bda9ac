package api

import (
	"net/http"
	"strconv"

	"github.com/labstack/echo/v5"

	"github.com/tokengate/tokengate/budget/alert"
)

// Alerts: endpoints (where events go, each with a signing secret shown
// once), rules (what raises events) and events (the outbox and each
// delivery attempt).

type endpointIn struct {
	URL         string `json:"url"`
	Description string `json:"description"`
}

func (s *Server) adminAlertEndpointCreate(c *echo.Context) error {
	var in endpointIn
	if err := decodeStrict(c, &in); err != nil {
		return err
	}
	ep, secret, err := s.admin.AlertEndpointCreate(c.Request().Context(), in.URL, in.Description)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusCreated, map[string]any{"endpoint": ep, "secret": secret,
		"note": "the signing secret is shown this once; verify the Tokengate-Signature header with it"})
}

func (s *Server) adminAlertEndpointList(c *echo.Context) error {
	eps, err := s.admin.AlertEndpointList(c.Request().Context())
	if err != nil {
		return err
	}
	if eps == nil {
		eps = []alert.Endpoint{}
	}
	return c.JSON(http.StatusOK, map[string]any{"endpoints": eps})
}

func (s *Server) adminAlertEndpointRotate(c *echo.Context) error {
	secret, err := s.admin.AlertEndpointRotate(c.Request().Context(), c.Param("endpoint"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]any{"id": c.Param("endpoint"), "secret": secret})
}

func (s *Server) adminAlertEndpointDisable(c *echo.Context) error {
	if err := s.admin.AlertEndpointDisable(c.Request().Context(), c.Param("endpoint")); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

type ruleIn struct {
	Tenant         string  `json:"tenant"`
	Endpoint       string  `json:"endpoint"`
	Kind           string  `json:"kind"`
	Thresholds     []int32 `json:"thresholds"`
	Limit          string  `json:"limit"`
	SustainMinutes int32   `json:"sustain_minutes"`
}

func (s *Server) adminAlertRuleCreate(c *echo.Context) error {
	var in ruleIn
	if err := decodeStrict(c, &in); err != nil {
		return err
	}
	r, err := s.admin.AlertRuleCreate(c.Request().Context(), alert.RuleParams{TenantID: in.Tenant, EndpointID: in.Endpoint, Kind: in.Kind,
		Thresholds: in.Thresholds, Limit: in.Limit, SustainMinutes: in.SustainMinutes})
	if err != nil {
		return err
	}
	return c.JSON(http.StatusCreated, r)
}

func (s *Server) adminAlertRuleList(c *echo.Context) error {
	rules, err := s.admin.AlertRuleList(c.Request().Context(), c.QueryParam("tenant"))
	if err != nil {
		return err
	}
	if rules == nil {
		rules = []alert.Rule{}
	}
	return c.JSON(http.StatusOK, map[string]any{"rules": rules})
}

func (s *Server) adminAlertRuleDelete(c *echo.Context) error {
	id, err := strconv.ParseInt(c.Param("rule"), 10, 64)
	if err != nil {
		return &Error{Status: http.StatusNotFound, Type: "not_found", Message: "no such alert rule"}
	}
	if err := s.admin.AlertRuleDelete(c.Request().Context(), id); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

func (s *Server) adminAlertEventList(c *echo.Context) error {
	f := alert.EventFilter{TenantID: c.QueryParam("tenant"), State: c.QueryParam("state"), EndpointID: c.QueryParam("endpoint")}
	if v := c.QueryParam("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return invalid("limit", "must be from 1 to 1000")
		}
		f.Limit = n
	}
	events, err := s.admin.AlertEventList(c.Request().Context(), f)
	if err != nil {
		return err
	}
	if events == nil {
		events = []alert.Event{}
	}
	return c.JSON(http.StatusOK, map[string]any{"events": events})
}

func (s *Server) adminAlertEventRedeliver(c *echo.Context) error {
	if err := s.admin.AlertEventRedeliver(c.Request().Context(), c.Param("event")); err != nil {
		return err
	}
	return c.JSON(http.StatusAccepted, map[string]any{"id": c.Param("event"), "state": "pending"})
}
