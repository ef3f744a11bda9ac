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

// setLease applies `tenant update --lease`, if given, and says what the
// mode does: in auto, the tenant's requests are admitted from its
// replicas' leases, or which rule keeps it exact whatever its mode.
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
	switch {
	case st.Mode != lease.ModeAuto:
		fmt.Fprintf(g.stderr, "tenant %s: every admission is decided exactly\n", st.TenantID)
	case st.ExactOnly != "":
		// Said here because an administrator who asks for leases would
		// otherwise expect them.
		fmt.Fprintf(g.stderr, "tenant %s stays in exact mode while %s has a %s\n", st.TenantID, st.ExactOnlyTenant, st.ExactOnly)
	default:
		fmt.Fprintf(g.stderr, "tenant %s: its requests are admitted from its replicas' leases (docs/leasing.md); "+
			"a replica's first ones, a pooled model's and a call of several requests are decided exactly\n", st.TenantID)
	}
	return nil
}
