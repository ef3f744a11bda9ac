package web

import (
	"context"
	"errors"
	"net/http"

	"github.com/labstack/echo/v5"

	"github.com/tokengate/tokengate/budget/lease"
	"github.com/tokengate/tokengate/budget/rule"
)

// A tenant's lease mode (docs/leasing.md) on its page: off, every
// admission decided exactly, or auto, replicas may lease its budget. The
// rule, its ledger entry and the end of live leases when it is set off are
// budget/admin's; these handlers only translate a form.

// leaseView is a tenant's lease mode on its page.
type leaseView struct {
	Mode  string
	Modes []string
}

// leaseModeView loads a tenant's lease mode for its page.
func (d *Dashboard) leaseModeView(ctx context.Context, id string) (leaseView, error) {
	m, err := d.admin.TenantLeaseMode(ctx, id)
	if err != nil {
		return leaseView{}, err
	}
	return leaseView{Mode: string(m), Modes: []string{string(lease.ModeOff), string(lease.ModeAuto)}}, nil
}

// leaseModeSet sets a tenant's lease mode. The answer says whether a rule
// of its tree keeps it exact whatever its mode, as the admin API's does.
func (d *Dashboard) leaseModeSet(c *echo.Context) error {
	id := c.Param("id")
	st, err := d.admin.TenantLeaseModeSet(c.Request().Context(), lease.SetModeParams{TenantID: id, Mode: lease.Mode(postForm(c).Get("lease_mode")), Actor: actor(c)})
	if le := (*rule.LimitError)(nil); errors.As(err, &le) {
		return pageErr(http.StatusUnprocessableEntity, "Lease mode: "+le.Reason+".")
	}
	if err != nil {
		return err
	}
	if st.Mode == lease.ModeAuto && st.ExactOnly != "" {
		return seeOther(c, tenantURL(id, "lease_exact"))
	}
	return seeOther(c, tenantURL(id, "lease"))
}
