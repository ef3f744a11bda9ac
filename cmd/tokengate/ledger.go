package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/admin"
	"github.com/tokengate/tokengate/ledger"
)

type ledgerCmd struct {
	Verify ledgerVerifyCmd `cmd:"" help:"Recompute hash chains and balances from the first entry, in exact arithmetic; exit 1 on the first broken entry (kind chain, arithmetic, overflow, head or balance)."`
	Report ledgerReportCmd `cmd:"" help:"Estimate versus actual usage per tenant and model."`
}

// errVerifyFailed makes the process exit non-zero after the report is
// printed.
var errVerifyFailed = errors.New("ledger verification failed")

type ledgerVerifyCmd struct {
	Tenant string `name:"tenant" help:"Only this tenant."`
	JSON   bool   `name:"json" help:"Print the results as JSON."`
}

func (c ledgerVerifyCmd) Run(ctx context.Context, g *globals) error {
	return g.withAdmin(ctx, func(svc *admin.Service) error {
		results, err := svc.LedgerVerify(ctx, c.Tenant)
		if err != nil {
			return err
		}
		ok := true
		for _, r := range results {
			ok = ok && r.OK
		}
		if c.JSON {
			if err := json.NewEncoder(g.stdout).Encode(map[string]any{"ok": ok, "tenants": results}); err != nil {
				return err
			}
		} else {
			w := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "TENANT\tENTRIES\tBALANCE\tRESULT")
			for _, r := range results {
				verdict := "ok"
				if !r.OK {
					verdict = fmt.Sprintf("BROKEN at entry %d (%s): %s", r.BrokenSeq, r.Kind, r.Problem)
				}
				fmt.Fprintf(w, "%s\t%d\t%s\t%s\n", r.TenantID, r.Entries, ledger.Tokens(r.BalanceMicro), verdict)
			}
			if err := w.Flush(); err != nil {
				return err
			}
		}
		if !ok {
			return errVerifyFailed
		}
		return nil
	})
}

type ledgerReportCmd struct {
	Tenant  string        `name:"tenant" help:"Only this tenant."`
	Model   string        `name:"model" help:"Only this model."`
	Since   time.Duration `name:"since" default:"24h" help:"Admissions created in this last span."`
	ByModel bool          `name:"by-model" help:"One row per model across tenants."`
	JSON    bool          `name:"json" help:"Print the rows as JSON."`
}

func (c ledgerReportCmd) Run(ctx context.Context, g *globals) error {
	return g.withReadAdmin(ctx, func(svc *admin.Service) error {
		rows, err := svc.DriftReport(ctx, account.DriftParams{TenantID: c.Tenant, Model: c.Model, From: time.Now().Add(-c.Since), ByModel: c.ByModel})
		if err != nil {
			return err
		}
		if c.JSON {
			return json.NewEncoder(g.stdout).Encode(rows)
		}
		w := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "TENANT\tMODEL\tADMISSIONS\tEST IN\tEST OUT\tACT IN\tACT OUT\tMEAN ERR\tP95 |ERR|\tEXPIRED\tREFUNDED\tEXTRA\tEST MONEY\tACT MONEY\tMONEY DRIFT")
		for _, r := range rows {
			model := r.Model
			if r.Batch {
				model += " (batch)" // its batch lines, beside its admissions
			}
			fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%+.1f%%\t%.1f%%\t%d\t%s\t%s\t%s\t%s\t%s\n", r.TenantID, model, r.Admissions,
				r.EstimatedInput, r.EstimatedOutput, r.ActualInput, r.ActualOutput, 100*r.MeanRelativeError, 100*r.P95AbsRelativeErr,
				r.Expired, r.RefundedMicro.Tokens(), r.ExtraChargedMicro.Tokens(),
				r.EstimatedMoneyMicro.Tokens(), r.ActualMoneyMicro.Tokens(), r.MoneyDriftMicro.Tokens())
		}
		return w.Flush()
	})
}
