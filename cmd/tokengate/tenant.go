package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/admin"
	"github.com/tokengate/tokengate/budget/rule"
)

type tenantCmd struct {
	Create  tenantCreateCmd  `cmd:"" help:"Create a tenant with a full token bucket."`
	List    tenantListCmd    `cmd:"" help:"List tenants with their balances and windows."`
	Show    tenantShowCmd    `cmd:"" help:"Show one tenant's balances and windows (each window's next reset in its zone)."`
	Update  tenantUpdateCmd  `cmd:"" help:"Change a tenant's limits (the others are kept)."`
	Disable tenantDisableCmd `cmd:"" help:"Disable a tenant: its requests answer 403."`
	Enable  tenantEnableCmd  `cmd:"" help:"Enable a disabled tenant."`
	Adjust  tenantAdjustCmd  `cmd:"" help:"Credit or debit a tenant's tokens, with a reason."`
	Tree    tenantTreeCmd    `cmd:"" help:"Show the budget tree that holds a tenant, every level with its balances."`
	Models  modelLimitsCmd   `cmd:"" name:"model-limits" help:"A tenant's per-model input and output token buckets."`

	// Batch is batch.go's.
	Batch batchAllowanceCmd `cmd:"" name:"batch-allowance" help:"Show or set a tenant's enqueued-tokens allowance for batches."`
}

type tenantCreateCmd struct {
	ID                 string        `arg:"" help:"Tenant id: 1-63 of a-z 0-9 _ . - ."`
	TokensCapacity     int64         `name:"tokens-capacity" required:"" help:"Token bucket size (burst), in cost units."`
	TokensPerSecond    string        `name:"tokens-per-second" required:"" help:"Token refill rate per second (decimal, up to 6 places)."`
	RequestsCapacity   int64         `name:"requests-capacity" help:"Optional request bucket size."`
	RequestsPerSecond  string        `name:"requests-per-second" help:"Request refill rate per second (with --requests-capacity)."`
	MaxConcurrent      int64         `name:"max-concurrent" help:"Optional cap on open reservations."`
	PeriodBudget       int64         `name:"period-budget" help:"Optional hard cap per calendar period (UTC)."`
	Period             string        `name:"period" enum:"day,month," default:"" help:"Period of --period-budget: day or month."`
	ReservationTTL     time.Duration `name:"reservation-ttl" default:"10m" help:"How long a reservation stays open before it expires."`
	MaxWait            time.Duration `name:"max-wait" default:"30s" help:"Longest max_wait_ms honoured for this tenant."`
	OnStoreUnavailable string        `name:"on-store-unavailable" enum:"reject,local," default:"" help:"Failure policy when the store is unreachable (default: the server's)."`
	IfNotExists        bool          `name:"if-not-exists" help:"Succeed without change when the tenant exists."`
	Parent             string        `name:"parent" help:"Nest this tenant's budget in another tenant's (up to 4 levels; fixed at creation): every admission must fit each level."`
	Shadow             []string      `name:"shadow" help:"Limits to evaluate and count without enforcing (tokens, requests, concurrency, period_budget); repeat or comma-separate."`
	Windows            []string      `name:"window" sep:"none" placeholder:"SPEC" help:"${window_help}"`
}

func (c tenantCreateCmd) limits() (rule.Limits, error) {
	l := rule.Limits{
		TokensCapacity:     c.TokensCapacity,
		RequestsCapacity:   c.RequestsCapacity,
		MaxConcurrent:      c.MaxConcurrent,
		PeriodBudget:       c.PeriodBudget,
		Period:             rule.Period(c.Period),
		ReservationTTL:     c.ReservationTTL,
		MaxWait:            c.MaxWait,
		OnStoreUnavailable: rule.Policy(c.OnStoreUnavailable),
	}
	var err error
	if l.Shadow, err = rule.ParseLimitSet("shadow", c.Shadow); err != nil {
		return l, fmt.Errorf("--shadow: %w", err)
	}
	if len(c.Windows) > 0 {
		if l.Windows, err = parseWindowSpecs(c.Windows); err != nil {
			return l, err
		}
	}
	if l.TokensRateMicro, err = rule.ParseRate(c.TokensPerSecond); err != nil {
		return l, fmt.Errorf("--tokens-per-second: %w", err)
	}
	if c.RequestsPerSecond != "" {
		if l.RequestsRateMicro, err = rule.ParseRate(c.RequestsPerSecond); err != nil {
			return l, fmt.Errorf("--requests-per-second: %w", err)
		}
	}
	return l, nil
}

func (c tenantCreateCmd) Run(ctx context.Context, g *globals) error {
	l, err := c.limits()
	if err != nil {
		return err
	}
	return g.withAdmin(ctx, func(svc *admin.Service) error {
		snap, err := svc.TenantCreate(ctx, account.CreateTenantParams{ID: c.ID, Parent: c.Parent, Limits: l, Actor: "cli"})
		if errors.Is(err, rule.ErrTenantExists) && c.IfNotExists {
			fmt.Fprintf(g.stderr, "tenant %s exists; unchanged\n", c.ID)
			return nil
		}
		if err != nil {
			return err
		}
		fmt.Fprintf(g.stderr, "created tenant %s: %d tokens, refilling %s/s\n", snap.TenantID, snap.Limits.TokensCapacity, rule.FormatRate(snap.Limits.TokensRateMicro))
		return nil
	})
}

type keyCmd struct {
	Create   keyCreateCmd   `cmd:"" help:"Create an API key for a tenant and print it once."`
	List     keyListCmd     `cmd:"" help:"List a tenant's keys (never their secrets)."`
	Revoke   keyRevokeCmd   `cmd:"" help:"Revoke a tenant's key."`
	Priority keyPriorityCmd `cmd:"" help:"Set a key's priority class for upstream pools: critical, standard or sheddable."`
	Models   keyModelsCmd   `cmd:"" help:"Show or set the models a key may use (within its tenant's)."`
}

type keyCreateCmd struct {
	Tenant string `arg:"" help:"Tenant id."`
	Models string `name:"models" placeholder:"LIST" help:"The models the key may use, comma-separated exact names or globs (claude-*, gpt-4o*), within its tenant's (default: every model the tenant may use)."`
	Actor  string `name:"actor" default:"cli" help:"Recorded in the ledger as who created the key."`
}

func (c keyCreateCmd) Run(ctx context.Context, g *globals) error {
	return g.withAdmin(ctx, func(svc *admin.Service) error {
		k, secret, err := svc.KeyCreate(ctx, c.Tenant, splitModels(c.Models), c.Actor)
		if err != nil {
			return err
		}
		printSecret(g.stdout, g.stderr, secret, fmt.Sprintf("API key %s for tenant %s (shown once; only its hash is stored):", k.ID, k.TenantID))
		return nil
	})
}

// printSecret writes the secret alone on its own stdout line, and the
// explanation on stderr, so that `KEY=$(tokengate key create t)` works.
func printSecret(stdout, stderr io.Writer, secret, note string) {
	fmt.Fprintln(stderr, note)
	fmt.Fprintln(stdout, secret)
}

// demoCmd seeds a first tenant and key for `make run`, only when the
// database has no tenant at all.
type demoCmd struct {
	Addr string `name:"addr" default:":8080" help:"Address serve will listen on, for the curl example."`
}

func (c demoCmd) Run(ctx context.Context, g *globals) error {
	return g.withAdmin(ctx, func(svc *admin.Service) error {
		host := c.Addr
		if len(host) > 0 && host[0] == ':' {
			host = "localhost" + host
		}
		tokens, err := svc.AdminTokenList(ctx)
		if err != nil {
			return err
		}
		if len(tokens) == 0 {
			_, secret, err := svc.AdminTokenCreate(ctx, "demo-admin")
			if err != nil {
				return err
			}
			fmt.Fprintf(g.stderr, "demo: the dashboard is at http://%s/ ; log in with this admin token, shown once:\n", host)
			fmt.Fprintln(g.stdout, secret)
		}
		tenants, err := svc.TenantList(ctx)
		if err != nil {
			return err
		}
		if len(tenants) > 0 {
			fmt.Fprintln(g.stderr, "demo: tenants exist; a new key: bin/tokengate key create demo ; a new admin token: bin/tokengate admin-token create NAME")
			return nil
		}
		l := rule.Limits{TokensCapacity: 100_000, TokensRateMicro: 1000 * rule.Micro, RequestsCapacity: 600,
			RequestsRateMicro: 10 * rule.Micro, MaxConcurrent: 50}
		if _, err := svc.TenantCreate(ctx, account.CreateTenantParams{ID: "demo", Limits: l, Actor: "demo"}); err != nil {
			return err
		}
		_, secret, err := svc.KeyCreate(ctx, "demo", nil, "demo")
		if err != nil {
			return err
		}
		fmt.Fprintf(g.stderr, `demo: created tenant "demo" (100000 tokens, 1000/s; 600 requests, 10/s; 50 concurrent).
	demo: its API key, shown once:
	`)
		fmt.Fprintln(g.stdout, secret)
		fmt.Fprintf(g.stderr, `demo: try it (TG_KEY is the key above):
	  export TG_KEY=<the key above>
	  curl -s -H "Authorization: Bearer $TG_KEY" http://%s/v1/admissions \
	    -d '{"model":"gpt-4o","messages":[{"role":"user","content":"Hello!"}],"max_tokens":100}'
	  curl -s -H "Authorization: Bearer $TG_KEY" http://%s/v1/admissions/ADMISSION_ID/settle \
	    -d '{"usage":{"prompt_tokens":9,"completion_tokens":12}}'
	  curl -s -H "Authorization: Bearer $TG_KEY" http://%s/v1/budget
	demo: throttle it and watch the dashboard: make demo-traffic TG_KEY=$TG_KEY
	`, host, host, host)
		return nil
	})
}
