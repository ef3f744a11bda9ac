package main

import (
	"context"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/tokengate/tokengate/budget/admin"
)

// gatewayCmd manages the credentials of gateways that call the rate limit
// service (serve --rls-addr) on behalf of tenants.
type gatewayCmd struct {
	Create gatewayCreateCmd `cmd:"" help:"Create a gateway credential and print it once."`
	List   gatewayListCmd   `cmd:"" help:"List gateway credentials (never their secrets)."`
	Revoke gatewayRevokeCmd `cmd:"" help:"Revoke a gateway credential."`
}

type gatewayCreateCmd struct {
	Name    string   `arg:"" help:"The gateway's name; recorded as the actor of its requests (gateway:NAME)."`
	Tenants []string `name:"tenants" required:"" sep:"," help:"Tenants it may ask for, comma-separated, or * for every tenant."`
}

func (c gatewayCreateCmd) Run(ctx context.Context, g *globals) error {
	return g.withAdmin(ctx, func(svc *admin.Service) error {
		gw, secret, err := svc.GatewayCreate(ctx, c.Name, c.Tenants)
		if err != nil {
			return err
		}
		printSecret(g.stdout, g.stderr, secret, fmt.Sprintf("gateway credential %s (%s, tenants %s), shown once; only its hash is stored:",
			gw.ID, gw.Name, strings.Join(gw.Tenants, ",")))
		return nil
	})
}

type gatewayListCmd struct{}

func (gatewayListCmd) Run(ctx context.Context, g *globals) error {
	return g.withAdmin(ctx, func(svc *admin.Service) error {
		gws, err := svc.GatewayList(ctx)
		if err != nil {
			return err
		}
		w := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "ID\tNAME\tTENANTS\tCREATED\tREVOKED")
		for _, gw := range gws {
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", gw.ID, gw.Name, strings.Join(gw.Tenants, ","), stamp(&gw.CreatedAt), stamp(gw.RevokedAt))
		}
		return w.Flush()
	})
}

type gatewayRevokeCmd struct {
	ID string `arg:"" help:"Gateway credential id (the part after tgw_)."`
}

func (c gatewayRevokeCmd) Run(ctx context.Context, g *globals) error {
	return g.withAdmin(ctx, func(svc *admin.Service) error {
		if err := svc.GatewayRevoke(ctx, c.ID); err != nil {
			return err
		}
		fmt.Fprintf(g.stderr, "revoked gateway credential %s\n", c.ID)
		return nil
	})
}
