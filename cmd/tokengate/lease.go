package main

import (
	"context"
	"fmt"

	"github.com/tokengate/tokengate/budget/admin"
	"github.com/tokengate/tokengate/budget/lease"
)

// checkLease refuses a --lease that is not a mode before anything is
// changed.
func (c tenantUpdateCmd) checkLease() error {
	if c.Lease == nil {
		return nil
	}
	_, err := lease.ParseMode(*c.Lease)
	return err
}

// setLease applies `tenant update --lease`, if given, and says which rule
// keeps the tenant exact whatever its mode.
func (c tenantUpdateCmd) setLease(ctx context.Context, g *globals, svc *admin.Service) error {
	if c.Lease == nil {
		return nil
	}
	mode, err := lease.ParseMode(*c.Lease)
	if err != nil {
		return err
	}
	st, err := svc.TenantLeaseModeSet(ctx, lease.SetModeParams{TenantID: c.ID, Mode: mode, Actor: c.Actor})
	if err != nil {
		return err
	}
	fmt.Fprintf(g.stderr, "tenant %s: lease mode %s\n", st.TenantID, st.Mode)
	if st.Mode == lease.ModeAuto {
		// Said here because an administrator who asks for leases would
		// otherwise expect them: the mode is recorded, not yet applied.
		fmt.Fprintf(g.stderr, "tenant %s: admissions do not use leases yet (docs/leasing.md); every admission is decided exactly\n", st.TenantID)
	}
	if st.Mode == lease.ModeAuto && st.ExactOnly != "" {
		fmt.Fprintf(g.stderr, "tenant %s stays in exact mode while %s has a %s\n", st.TenantID, st.ExactOnlyTenant, st.ExactOnly)
	}
	return nil
}
