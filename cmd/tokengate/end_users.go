package main

import (
	"context"
	"errors"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/admin"
	"github.com/tokengate/tokengate/budget/rule"
)

// endUsersCmd manages a tenant's end users: the policy that gives each of
// its end users a leaf budget of its own on first sight, and the list of
// those end users.
type endUsersCmd struct {
	Policy endUserPolicyCmd `cmd:"" help:"A tenant's end-user policy: the source of end-user ids, the template, the cap, the idle TTL."`
	List   endUsersListCmd  `cmd:"" help:"List a tenant's end users with their balances."`
}

type endUserPolicyCmd struct {
	Set    endUserPolicySetCmd    `cmd:"" help:"Set (create or replace) a tenant's end-user policy; a changed template applies to every live end user."`
	Get    endUserPolicyGetCmd    `cmd:"" help:"Show a tenant's end-user policy."`
	Delete endUserPolicyDeleteCmd `cmd:"" help:"Delete a tenant's end-user policy (its end users stay; no new one is made)."`
}

type endUserPolicySetCmd struct {
	Tenant      string        `arg:"" help:"Tenant id."`
	Source      string        `name:"source" required:"" enum:"user,safety_identifier,metadata.user_id,header" help:"Where a request names its end user: user, safety_identifier (OpenAI bodies; on Anthropic's Messages API both read metadata.user_id), metadata.user_id, or header. A request naming one only in another field is refused (400 naming this one)."`
	Header      string        `name:"header" help:"The header's name, with --source header."`
	MaxEndUsers int           `name:"max-end-users" required:"" help:"How many live end users the tenant may have."`
	IdleTTL     time.Duration `name:"idle-ttl" default:"720h" help:"An end user idle this long (and with no open reservation) expires."`
	// The template: the limits each end user is created with, as tenant
	// create takes them.
	TokensCapacity    int64         `name:"tokens-capacity" required:"" help:"Each end user's token bucket size."`
	TokensPerSecond   string        `name:"tokens-per-second" required:"" help:"Each end user's token refill per second (decimal)."`
	RequestsCapacity  int64         `name:"requests-capacity" help:"Optional request bucket size."`
	RequestsPerSecond string        `name:"requests-per-second" help:"Request refill per second (with --requests-capacity)."`
	MaxConcurrent     int64         `name:"max-concurrent" help:"Optional cap on each end user's open reservations."`
	PeriodBudget      int64         `name:"period-budget" help:"Optional hard cap per calendar period."`
	Period            string        `name:"period" enum:"day,month," default:"" help:"Period of --period-budget."`
	ReservationTTL    time.Duration `name:"reservation-ttl" default:"10m" help:"How long a reservation stays open."`
	MaxWait           time.Duration `name:"max-wait" default:"30s" help:"Longest max_wait_ms honoured."`
	Windows           []string      `name:"window" sep:"none" placeholder:"SPEC" help:"Each end user's calendar windows, as tenant create takes them. ${window_help}"`
	Actor             string        `name:"actor" default:"cli" help:"Recorded in the ledger as who made the change."`
}

func (c endUserPolicySetCmd) Run(ctx context.Context, g *globals) error {
	l, err := tenantCreateCmd{TokensCapacity: c.TokensCapacity, TokensPerSecond: c.TokensPerSecond, RequestsCapacity: c.RequestsCapacity,
		RequestsPerSecond: c.RequestsPerSecond, MaxConcurrent: c.MaxConcurrent, PeriodBudget: c.PeriodBudget, Period: c.Period,
		ReservationTTL: c.ReservationTTL, MaxWait: c.MaxWait, Windows: c.Windows}.limits()
	if err != nil {
		return err
	}
	return g.withAdmin(ctx, func(svc *admin.Service) error {
		p, err := svc.EndUserPolicySet(ctx, account.EndUserPolicyParams{TenantID: c.Tenant,
			Source: rule.EndUserSource(c.Source), Header: c.Header, Template: l, MaxEndUsers: c.MaxEndUsers, IdleTTL: c.IdleTTL, Actor: c.Actor})
		if err != nil {
			return err
		}
		fmt.Fprintf(g.stderr, "set %s's end-user policy (source %s, at most %d end users)\n", p.TenantID, p.Source, p.MaxEndUsers)
		return nil
	})
}

type endUserPolicyGetCmd struct {
	Tenant string `arg:"" help:"Tenant id."`
}

func (c endUserPolicyGetCmd) Run(ctx context.Context, g *globals) error {
	return g.withAdmin(ctx, func(svc *admin.Service) error {
		p, err := svc.EndUserPolicyGet(ctx, c.Tenant)
		if errors.Is(err, rule.ErrNoEndUserPolicy) {
			return fmt.Errorf("%s has no end-user policy", c.Tenant)
		}
		if err != nil {
			return err
		}
		source := string(p.Source)
		if p.Source == rule.SourceHeader {
			source += " " + p.Header
		}
		fmt.Fprintf(g.stdout, "tenant\t%s\nsource\t%s\nmax end users\t%d\nidle ttl\t%s\ntemplate\t%s\nupdated\t%s by %s\n",
			p.TenantID, source, p.MaxEndUsers, p.IdleTTL, rule.LimitsJSON(p.Template), p.UpdatedAt.UTC().Format(time.RFC3339), p.UpdatedBy)
		return nil
	})
}

type endUserPolicyDeleteCmd struct {
	Tenant string `arg:"" help:"Tenant id."`
	Actor  string `name:"actor" default:"cli" help:"Recorded in the ledger as who made the change."`
}

func (c endUserPolicyDeleteCmd) Run(ctx context.Context, g *globals) error {
	return g.withAdmin(ctx, func(svc *admin.Service) error {
		return svc.EndUserPolicyDelete(ctx, c.Tenant, c.Actor)
	})
}

type endUsersListCmd struct {
	Tenant string `arg:"" help:"Tenant id."`
	After  string `name:"after" help:"List the end users after this id (the last of the previous page)."`
	Limit  int    `name:"limit" default:"100" help:"At most this many (1-1000)."`
}

func (c endUsersListCmd) Run(ctx context.Context, g *globals) error {
	if c.Limit < 1 || c.Limit > 1000 {
		return errors.New("--limit: must be between 1 and 1000")
	}
	return g.withAdmin(ctx, func(svc *admin.Service) error {
		list, err := svc.EndUserList(ctx, c.Tenant, c.After, c.Limit)
		if err != nil {
			return err
		}
		w := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "ID\tEND USER\tTOKENS\tOPEN\tLAST SEEN\tEXPIRED")
		for _, u := range list {
			expired := "-"
			if u.ExpiredAt != nil {
				expired = u.ExpiredAt.UTC().Format(time.RFC3339)
			}
			fmt.Fprintf(w, "%s\t%q\t%d/%d\t%d\t%s\t%s\n", u.Snapshot.TenantID, u.EndUserID, u.Snapshot.Tokens(), u.Snapshot.Limits.TokensCapacity,
				u.Snapshot.OpenReservations, u.LastSeen.UTC().Format(time.RFC3339), expired)
		}
		if err := w.Flush(); err != nil {
			return err
		}
		snaps := make([]rule.Snapshot, len(list))
		for i, u := range list {
			snaps[i] = u.Snapshot
		}
		return printWindows(ctx, g.stdout, svc, snaps)
	})
}
