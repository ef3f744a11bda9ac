package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"github.com/tokengate/tokengate/budget/admin"
	"github.com/tokengate/tokengate/estimator"
)

type pricesCmd struct {
	Import pricesImportCmd `cmd:"" help:"Apply the price table shipped in this binary (or --file): a model gets a new price, effective now, only where it differs from the one in effect."`
	List   pricesListCmd   `cmd:"" help:"List the prices in effect now (or --at TIME)."`
	Add    pricesAddCmd    `cmd:"" help:"Add a price for a model, effective now or at a later --effective-from; prices are never changed in place."`
}

type pricesImportCmd struct {
	File  string `name:"file" type:"existingfile" help:"A price file (the format of estimator/prices/default.json) instead of the embedded table."`
	Actor string `name:"actor" default:"cli" help:"Recorded as who added the prices."`
}

func (c pricesImportCmd) Run(ctx context.Context, g *globals) error {
	f, err := estimator.DefaultPriceFile()
	if c.File != "" {
		var b []byte
		if b, err = os.ReadFile(c.File); err == nil {
			f, err = estimator.ParsePriceFile(b)
		}
	}
	if err != nil {
		return err
	}
	return g.withAdmin(ctx, func(svc *admin.Service) error {
		res, err := svc.PriceImport(ctx, f, c.Actor)
		if err != nil {
			return err
		}
		for _, p := range res.Inserted {
			fmt.Fprintf(g.stdout, "added %s\n", p.Model)
		}
		fmt.Fprintf(g.stderr, "prices %s: %d added, %d unchanged\n", f.Version, len(res.Inserted), res.Unchanged)
		return nil
	})
}

type pricesListCmd struct {
	Model       string `name:"model" help:"Only this model."`
	ServiceTier string `name:"service-tier" help:"Only this service tier (default, flex, priority, batch)."`
	At          string `name:"at" help:"The time to list the prices in effect at (RFC 3339); default now."`
}

func (c pricesListCmd) Run(ctx context.Context, g *globals) error {
	at := time.Now()
	if c.At != "" {
		var err error
		if at, err = time.Parse(time.RFC3339, c.At); err != nil {
			return fmt.Errorf("--at: %w", err)
		}
	}
	return g.withAdmin(ctx, func(svc *admin.Service) error {
		ps, err := svc.PriceList(ctx, c.Model, c.ServiceTier, at)
		if err != nil {
			return err
		}
		return writePrices(g.stdout, ps)
	})
}

// writePrices prints prices per million tokens; "-" marks a price that
// falls back to another (cached input and cache writes to input, the hour
// write to the 5 minute one, reasoning to output).
func writePrices(out io.Writer, ps []estimator.Price) error {
	opt := func(v *int64) string {
		if v == nil {
			return "-"
		}
		return estimator.FormatPrice(*v)
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "MODEL\tTIER\tCURRENCY\tINPUT\tOUTPUT\tCACHED IN\tWRITE 5M\tWRITE 1H\tREASONING\tLONG CONTEXT\tEFFECTIVE FROM\tBY")
	for _, p := range ps {
		long := "-"
		if p.LongContextThreshold != nil {
			long = fmt.Sprintf(">%d: %s/%s", *p.LongContextThreshold, estimator.FormatPrice(*p.LongInputMicro), estimator.FormatPrice(*p.LongOutputMicro))
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", p.Model, estimator.TierOr(p.ServiceTier), p.Currency, estimator.FormatPrice(p.InputMicro),
			estimator.FormatPrice(p.OutputMicro), opt(p.CachedInputMicro), opt(p.CacheWrite5mMicro), opt(p.CacheWrite1hMicro),
			opt(p.ReasoningOutputMicro), long, p.EffectiveFrom.UTC().Format(time.RFC3339), p.CreatedBy)
	}
	return w.Flush()
}

type pricesAddCmd struct {
	Model           string  `arg:"" help:"Model name, as in the model table."`
	ServiceTier     string  `name:"service-tier" help:"The service tier the price is for: default, flex, priority or batch (default: default). A tier without a price of its own is charged at the default tier's."`
	Input           string  `name:"input" required:"" help:"Price per million input tokens (decimal)."`
	Output          string  `name:"output" required:"" help:"Price per million output tokens (decimal)."`
	CachedInput     *string `name:"cached-input" help:"Per million input tokens read from the prompt cache (default: as input)."`
	CacheWrite5m    *string `name:"cache-write-5m" help:"Per million input tokens written to the prompt cache for 5 minutes (default: as input)."`
	CacheWrite1h    *string `name:"cache-write-1h" help:"Per million input tokens written for an hour (default: as the 5 minute write)."`
	ReasoningOutput *string `name:"reasoning-output" help:"Per million reasoning tokens (default: as output)."`
	LongThreshold   *int64  `name:"long-context-threshold" help:"Input tokens above which the long-context prices apply."`
	LongInput       *string `name:"long-context-input" help:"Per million input tokens above the threshold."`
	LongOutput      *string `name:"long-context-output" help:"Per million output tokens above the threshold."`
	Currency        string  `name:"currency" help:"The price's currency (ISO 4217); default: the deployment's (USD before any price is stored), as the API and the dashboard add prices."`
	EffectiveFrom   string  `name:"effective-from" help:"When the price takes effect (RFC 3339, not in the past); default now."`
	Actor           string  `name:"actor" default:"cli" help:"Recorded as who added the price."`
}

func (c pricesAddCmd) Run(ctx context.Context, g *globals) error {
	p := estimator.Price{Model: c.Model, ServiceTier: c.ServiceTier, Currency: c.Currency, Source: "cli", CreatedBy: c.Actor}
	var err error
	if c.EffectiveFrom != "" {
		if p.EffectiveFrom, err = time.Parse(time.RFC3339, c.EffectiveFrom); err != nil {
			return fmt.Errorf("--effective-from: %w", err)
		}
	}
	if p.InputMicro, err = estimator.ParsePrice(c.Input, "--input"); err != nil {
		return err
	}
	if p.OutputMicro, err = estimator.ParsePrice(c.Output, "--output"); err != nil {
		return err
	}
	for _, o := range []struct {
		s    *string
		flag string
		dst  **int64
	}{
		{c.CachedInput, "--cached-input", &p.CachedInputMicro}, {c.CacheWrite5m, "--cache-write-5m", &p.CacheWrite5mMicro},
		{c.CacheWrite1h, "--cache-write-1h", &p.CacheWrite1hMicro}, {c.ReasoningOutput, "--reasoning-output", &p.ReasoningOutputMicro},
		{c.LongInput, "--long-context-input", &p.LongInputMicro}, {c.LongOutput, "--long-context-output", &p.LongOutputMicro},
	} {
		if o.s == nil {
			continue
		}
		v, err := estimator.ParsePrice(*o.s, o.flag)
		if err != nil {
			return err
		}
		*o.dst = &v
	}
	p.LongContextThreshold = c.LongThreshold
	return g.withAdmin(ctx, func(svc *admin.Service) error {
		stored, err := svc.PriceAdd(ctx, p)
		if err != nil {
			return err
		}
		return writePrices(g.stdout, []estimator.Price{stored})
	})
}
