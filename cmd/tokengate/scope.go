package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/admin"
)

// Model scopes from the command line (issue 38): the rule and its ledger
// entries are budget/admin's.

// splitModels reads a comma-separated list of model names or globs ("":
// every model).
func splitModels(s string) []string {
	var out []string
	for _, m := range strings.Split(s, ",") {
		if m = strings.TrimSpace(m); m != "" {
			out = append(out, m)
		}
	}
	return out
}

// showModels is a scope as the CLI prints it.
func showModels(m []string) string {
	if len(m) == 0 {
		return "every model"
	}
	return strings.Join(m, ",")
}

// onlyModels says no limit flag (nor --lease) was given beside --models.
func (c tenantUpdateCmd) onlyModels() bool {
	return c.Lease == nil && c.TokensCapacity == nil && c.TokensPerSecond == nil && c.RequestsCapacity == nil && c.RequestsPerSecond == nil &&
		c.MaxConcurrent == nil && c.PeriodBudget == nil && c.Period == nil && c.ReservationTTL == nil && c.MaxWait == nil &&
		c.OnStoreUnavailable == nil && c.Shadow == nil && len(c.Windows) == 0 && !c.NoWindows
}

func (c tenantUpdateCmd) setModels(ctx context.Context, g *globals, svc *admin.Service) error {
	snap, err := svc.TenantModelsSet(ctx, account.SetModelsParams{TenantID: c.ID, Models: splitModels(*c.Models), Actor: c.Actor})
	if err != nil {
		return fmt.Errorf("--models: %w", err)
	}
	fmt.Fprintf(g.stderr, "tenant %s may use: %s\n", snap.TenantID, showModels(snap.Models))
	return nil
}

type keyModelsCmd struct {
	Tenant string  `arg:"" help:"Tenant id."`
	Key    string  `arg:"" help:"Key id."`
	Set    *string `name:"set" placeholder:"LIST" help:"Replace the list: comma-separated exact names or globs; --set= allows every model the tenant may use."`
	Actor  string  `name:"actor" default:"cli" help:"Recorded in the ledger as who made the change."`
}

func (c keyModelsCmd) Run(ctx context.Context, g *globals) error {
	return g.withAdmin(ctx, func(svc *admin.Service) error {
		var models []string
		var err error
		if c.Set != nil {
			models, err = svc.KeySetModels(ctx, c.Tenant, c.Key, splitModels(*c.Set), c.Actor)
		} else {
			models, err = svc.KeyModels(ctx, c.Tenant, c.Key)
		}
		if err != nil {
			return err
		}
		fmt.Fprintln(g.stdout, showModels(models))
		return nil
	})
}
