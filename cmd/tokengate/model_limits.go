package main

import (
	"context"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/admin"
	"github.com/tokengate/tokengate/budget/rule"
)

// modelLimitsCmd manages a tenant's per-model input and output token
// buckets (ITPM / OTPM), which every admission for the model must fit
// beside the tenant-wide limits.
type modelLimitsCmd struct {
	Set    modelLimitsSetCmd    `cmd:"" help:"Set (create or replace) a tenant's limits for a model."`
	List   modelLimitsListCmd   `cmd:"" help:"List a tenant's model limits with their balances."`
	Remove modelLimitsRemoveCmd `cmd:"" help:"Remove a tenant's limits for a model."`
}

type modelLimitsSetCmd struct {
	Tenant          string   `arg:"" help:"Tenant id."`
	Model           string   `arg:"" help:"Model table entry (dated variants share it) or model name."`
	InputCapacity   int64    `name:"input-capacity" help:"Input token bucket size (raw tokens)."`
	InputPerSecond  string   `name:"input-per-second" help:"Input token refill per second (decimal)."`
	OutputCapacity  int64    `name:"output-capacity" help:"Output token bucket size (raw tokens)."`
	OutputPerSecond string   `name:"output-per-second" help:"Output token refill per second (decimal)."`
	Shadow          []string `name:"shadow" help:"input_tokens and/or output_tokens: evaluated and counted, never enforced."`
	Actor           string   `name:"actor" default:"cli" help:"Recorded in the ledger as who made the change."`
}

func (c modelLimitsSetCmd) Run(ctx context.Context, g *globals) error {
	l := rule.ModelLimits{Model: c.Model, InputCapacity: c.InputCapacity, OutputCapacity: c.OutputCapacity}
	var err error
	if c.InputPerSecond != "" {
		if l.InputRateMicro, err = rule.ParseRate(c.InputPerSecond); err != nil {
			return fmt.Errorf("--input-per-second: %w", err)
		}
	}
	if c.OutputPerSecond != "" {
		if l.OutputRateMicro, err = rule.ParseRate(c.OutputPerSecond); err != nil {
			return fmt.Errorf("--output-per-second: %w", err)
		}
	}
	if l.Shadow, err = rule.ParseLimitSet("shadow", c.Shadow); err != nil {
		return fmt.Errorf("--shadow: %w", err)
	}
	return g.withAdmin(ctx, func(svc *admin.Service) error {
		_, err := svc.ModelLimitsSet(ctx, account.SetModelLimitsParams{TenantID: c.Tenant, Limits: l, Actor: c.Actor})
		if err != nil {
			return err
		}
		fmt.Fprintf(g.stderr, "set %s's limits for %s\n", c.Tenant, c.Model)
		return nil
	})
}

type modelLimitsListCmd struct {
	Tenant string `arg:"" help:"Tenant id."`
}

func (c modelLimitsListCmd) Run(ctx context.Context, g *globals) error {
	return g.withAdmin(ctx, func(svc *admin.Service) error {
		list, err := svc.ModelLimitsList(ctx, c.Tenant)
		if err != nil {
			return err
		}
		w := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "MODEL\tINPUT\tINPUT/S\tOUTPUT\tOUTPUT/S\tSHADOW")
		bucket := func(capacity, rate, micro int64) (string, string) {
			if capacity == 0 {
				return "-", "-"
			}
			return fmt.Sprintf("%d/%d", micro/rule.Micro, capacity), rule.FormatRate(rate)
		}
		for _, m := range list {
			l := m.Limits
			in, inRate := bucket(l.InputCapacity, l.InputRateMicro, m.InputMicro)
			out, outRate := bucket(l.OutputCapacity, l.OutputRateMicro, m.OutputMicro)
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", l.Model, in, inRate, out, outRate, orDash(strings.Join(l.Shadow.Strings(), ",")))
		}
		return w.Flush()
	})
}

type modelLimitsRemoveCmd struct {
	Tenant string `arg:"" help:"Tenant id."`
	Model  string `arg:"" help:"Model."`
	Actor  string `name:"actor" default:"cli" help:"Recorded in the ledger as who made the change."`
}

func (c modelLimitsRemoveCmd) Run(ctx context.Context, g *globals) error {
	return g.withAdmin(ctx, func(svc *admin.Service) error {
		return svc.ModelLimitsRemove(ctx, c.Tenant, c.Model, c.Actor)
	})
}
