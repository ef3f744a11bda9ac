package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/tokengate/tokengate/budget/admin"
	"github.com/tokengate/tokengate/budget/batch"
	"github.com/tokengate/tokengate/budget/rule"
)

// batchAllowanceCmd shows a tenant's batch allowance, or sets it with
// --capacity. The models a batch line may name are its key's and tenant's
// (tenant update --models, key models).
type batchAllowanceCmd struct {
	ID       string `arg:"" help:"Tenant id."`
	Capacity *int64 `name:"capacity" help:"Tokens (at batch prices) the tenant's open batches may hold at once; 0 refuses new batches."`
	Actor    string `name:"actor" default:"cli" help:"Who makes the change, for the ledger."`
}

func (c batchAllowanceCmd) Run(ctx context.Context, g *globals) error {
	return g.withAdmin(ctx, func(svc *admin.Service) error {
		a, err := svc.BatchAllowance(ctx, c.ID)
		if c.Capacity != nil {
			a, err = svc.BatchAllowanceSet(ctx, batch.SetAllowanceParams{TenantID: c.ID, Capacity: *c.Capacity, Actor: c.Actor})
		}
		if errors.Is(err, batch.ErrNoAllowance) {
			fmt.Fprintf(g.stdout, "tenant %s has no batch allowance: its batches are refused\n", c.ID)
			return nil
		}
		if err != nil {
			return err
		}
		fmt.Fprintf(g.stdout, "tenant %s: batch allowance %d tokens, %s enqueued\n", c.ID, a.Capacity,
			fmt.Sprintf("%.6g", float64(a.EnqueuedMicro)/rule.Micro))
		return nil
	})
}
