package main

import (
	"context"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/tokengate/tokengate/budget/admin"
	"github.com/tokengate/tokengate/budget/rule"
)

// poolCmd manages upstream capacity pools: one upstream deployment's own
// limit, which the admissions of the models routed to it must also fit,
// shared between tenants by weight when it is short.
type poolCmd struct {
	Create poolCreateCmd `cmd:"" help:"Create a pool with a full bucket."`
	List   poolListCmd   `cmd:"" help:"List pools, their models and each tenant's share."`
	Update poolUpdateCmd `cmd:"" help:"Change a pool's bucket."`
	Route  poolRouteCmd  `cmd:"" help:"Make admissions of a model draw on a pool (--off takes it off)."`
	Weight poolWeightCmd `cmd:"" help:"Set a tenant's weight in a pool (default 1)."`
}

type poolLimitsFlags struct {
	TokensCapacity  int64  `name:"tokens-capacity" required:"" help:"Bucket size, in raw tokens (input + output)."`
	TokensPerSecond string `name:"tokens-per-second" required:"" help:"Refill per second (the upstream's TPM / 60)."`
}

func (f poolLimitsFlags) limits() (rule.PoolLimits, error) {
	rate, err := rule.ParseRate(f.TokensPerSecond)
	if err != nil {
		return rule.PoolLimits{}, fmt.Errorf("--tokens-per-second: %w", err)
	}
	return rule.PoolLimits{TokensCapacity: f.TokensCapacity, TokensRateMicro: rate}, nil
}

type poolCreateCmd struct {
	ID string `arg:"" help:"Pool id."`
	poolLimitsFlags
	Models []string `name:"model" help:"Models that draw on it (repeat)."`
}

func (c poolCreateCmd) Run(ctx context.Context, g *globals) error {
	l, err := c.limits()
	if err != nil {
		return err
	}
	return g.withAdmin(ctx, func(svc *admin.Service) error {
		if err := svc.PoolCreate(ctx, c.ID, l, c.Models...); err != nil {
			return err
		}
		fmt.Fprintf(g.stderr, "created pool %s: %d tokens, refilling %s/s\n", c.ID, l.TokensCapacity, rule.FormatRate(l.TokensRateMicro))
		return nil
	})
}

type poolUpdateCmd struct {
	ID string `arg:"" help:"Pool id."`
	poolLimitsFlags
}

func (c poolUpdateCmd) Run(ctx context.Context, g *globals) error {
	l, err := c.limits()
	if err != nil {
		return err
	}
	return g.withAdmin(ctx, func(svc *admin.Service) error { return svc.PoolSetLimits(ctx, c.ID, l) })
}

type poolRouteCmd struct {
	Model string `arg:"" help:"Model table entry or model name."`
	Pool  string `arg:"" optional:"" help:"Pool id."`
	Off   bool   `name:"off" help:"Take the model off its pool."`
}

func (c poolRouteCmd) Run(ctx context.Context, g *globals) error {
	if c.Off == (c.Pool != "") {
		return fmt.Errorf("give a pool, or --off")
	}
	return g.withAdmin(ctx, func(svc *admin.Service) error { return svc.PoolRoute(ctx, c.Model, c.Pool) })
}

type poolWeightCmd struct {
	Pool   string `arg:"" help:"Pool id."`
	Tenant string `arg:"" help:"Tenant id."`
	Weight int64  `arg:"" help:"Weight (1 to 1000000): its share is weight / the sum of the weights of the tenants waiting."`
}

func (c poolWeightCmd) Run(ctx context.Context, g *globals) error {
	return g.withAdmin(ctx, func(svc *admin.Service) error {
		return svc.PoolSetWeight(ctx, c.Pool, c.Tenant, c.Weight)
	})
}

type poolListCmd struct{}

func (poolListCmd) Run(ctx context.Context, g *globals) error {
	return g.withAdmin(ctx, func(svc *admin.Service) error {
		pools, err := svc.PoolList(ctx)
		if err != nil {
			return err
		}
		w := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "POOL\tTOKENS\tPER SECOND\tMODELS\tTENANT\tWEIGHT\tSERVED\tSHARE")
		for _, p := range pools {
			var total int64
			for _, sh := range p.Shares {
				total += sh.Served
			}
			head := fmt.Sprintf("%s\t%d/%d\t%s\t%s", p.ID, p.TokensMicro/rule.Micro, p.Limits.TokensCapacity,
				rule.FormatRate(p.Limits.TokensRateMicro), orDash(strings.Join(p.Models, ",")))
			if len(p.Shares) == 0 {
				fmt.Fprintf(w, "%s\t-\t-\t-\t-\n", head)
			}
			for i, sh := range p.Shares {
				if i > 0 {
					head = "\t\t\t"
				}
				share := "-"
				if total > 0 {
					share = fmt.Sprintf("%.1f%%", 100*float64(sh.Served)/float64(total))
				}
				fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%s\n", head, sh.TenantID, sh.Weight, sh.Served, share)
			}
		}
		return w.Flush()
	})
}

type keyPriorityCmd struct {
	Tenant   string `arg:"" help:"Tenant id."`
	Key      string `arg:"" help:"Key id (the part after tg_)."`
	Priority string `arg:"" enum:"critical,standard,sheddable" help:"critical, standard or sheddable."`
	Actor    string `name:"actor" default:"cli" help:"Recorded in the ledger as who made the change."`
}

func (c keyPriorityCmd) Run(ctx context.Context, g *globals) error {
	return g.withAdmin(ctx, func(svc *admin.Service) error {
		return svc.KeySetPriority(ctx, c.Tenant, c.Key, rule.Priority(c.Priority), c.Actor)
	})
}
