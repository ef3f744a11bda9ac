package api

import (
	"net/http"

	"github.com/labstack/echo/v5"

	"github.com/tokengate/tokengate/budget/lease"
)

// leaseModeJSON is a tenant's lease mode as the admin API shows it, with
// the rule that keeps the tenant exact whatever its mode (null: none).
type leaseModeJSON struct {
	TenantID  string         `json:"tenant_id"`
	Mode      lease.Mode     `json:"mode"`
	ExactOnly *exactOnlyJSON `json:"exact_only"`
}

type exactOnlyJSON struct {
	TenantID string `json:"tenant_id"`
	Rule     string `json:"rule"`
}

func (s *Server) adminTenantLeaseGet(c *echo.Context) error {
	m, err := s.admin.TenantLeaseMode(c.Request().Context(), c.Param("id"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, leaseModeJSON{TenantID: c.Param("id"), Mode: m})
}

func (s *Server) adminTenantLeasePut(c *echo.Context) error {
	var in struct {
		Mode *string `json:"mode"`
	}
	if err := decodeStrict(c, &in); err != nil {
		return err
	}
	if in.Mode == nil {
		return invalid("mode", `required: "off" or "auto"`)
	}
	if _, err := lease.ParseMode(*in.Mode); err != nil {
		return invalid("mode", `must be "off" or "auto"`)
	}
	st, err := s.admin.TenantLeaseModeSet(c.Request().Context(), lease.SetModeParams{TenantID: c.Param("id"), Mode: lease.Mode(*in.Mode), Actor: actorOf(c)})
	if err != nil {
		return err
	}
	out := leaseModeJSON{TenantID: st.TenantID, Mode: st.Mode}
	if st.ExactOnly != "" {
		out.ExactOnly = &exactOnlyJSON{TenantID: st.ExactOnlyTenant, Rule: st.ExactOnly}
	}
	return c.JSON(http.StatusOK, out)
}
