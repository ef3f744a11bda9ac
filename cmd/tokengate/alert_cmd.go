package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/tokengate/tokengate/budget/admin"
	"github.com/tokengate/tokengate/budget/alert"
)

// alertCmd manages budget alerts: the webhook endpoints, the rules that
// raise events for them, and the outbox of events with its delivery log.
// Delivery itself is serve's (the dispatcher); these commands only edit
// and read what it works from.
type alertCmd struct {
	Endpoint  alertEndpointCmd  `cmd:"" help:"Manage webhook endpoints and their signing secrets."`
	Rule      alertRuleCmd      `cmd:"" help:"Manage the rules that raise alert events."`
	Events    alertEventsCmd    `cmd:"" help:"List alert events, newest first, with their delivery attempts."`
	Redeliver alertRedeliverCmd `cmd:"" help:"Put a failed event back in the outbox, due now."`
}

type alertEndpointCmd struct {
	Create  alertEndpointCreateCmd  `cmd:"" help:"Add a webhook endpoint and print its signing secret once."`
	List    alertEndpointListCmd    `cmd:"" help:"List endpoints with their pending and failed events (never their secrets)."`
	Rotate  alertEndpointRotateCmd  `cmd:"" help:"Give an endpoint a new signing secret and print it once; the old one stops signing at once."`
	Disable alertEndpointDisableCmd `cmd:"" help:"Stop deliveries to an endpoint: its rules stop raising events and its pending events are given up."`
}

type alertRuleCmd struct {
	Create alertRuleCreateCmd `cmd:"" help:"Add a rule; it applies from the next decision on."`
	List   alertRuleListCmd   `cmd:"" help:"List rules."`
	Delete alertRuleDeleteCmd `cmd:"" help:"Stop a rule; its events and their log stay."`
}

// alertKeyFlag is serve's --alert-key, under the same name and variable:
// a secret printed here signs only if it derives from the server's key.
type alertKeyFlag struct {
	Key string `name:"alert-key" env:"TOKENGATE_ALERT_KEY" help:"The server's alert key (the same as serve's, 32 bytes or more), from which signing secrets derive. Never printed."`
}

// key returns the alert key, or why it cannot be used. Its value never
// appears in an error.
func (f alertKeyFlag) key() ([]byte, error) {
	switch {
	case f.Key == "":
		return nil, fmt.Errorf("%w: set TOKENGATE_ALERT_KEY or --alert-key to the server's key", alert.ErrNoKey)
	case len(f.Key) < 32:
		return nil, errors.New("--alert-key must be at least 32 bytes")
	}
	return []byte(f.Key), nil
}

// withAlerts runs fn with the admin service on an alert store with key
// and policy, and turns the store's errors into the CLI's: a field error
// names its flag.
func (g *globals) withAlerts(ctx context.Context, key []byte, policy alert.Policy, fn func(*admin.Service) error) error {
	return g.withPool(ctx, func(pool *pgxpool.Pool) error {
		s := alert.NewStore(pool, key)
		s.Policy = policy
		svc, err := admin.New(admin.Config{DB: pool, Alerts: s, Logger: g.logger()})
		if err != nil {
			return err
		}
		return alertError(fn(svc))
	})
}

// alertFlagNames are the flags of the fields whose names differ.
var alertFlagNames = map[string]string{"sustain_minutes": "minutes"}

func alertError(err error) error {
	var fe *alert.FieldError
	if !errors.As(err, &fe) {
		return err
	}
	flag, ok := alertFlagNames[fe.Field]
	if !ok {
		flag = strings.ReplaceAll(fe.Field, "_", "-")
	}
	return fmt.Errorf("--%s: %s", flag, fe.Reason)
}

// notFound names what was looked for when the store found nothing.
func notFound(err error, what string) error {
	if errors.Is(err, alert.ErrNotFound) {
		return fmt.Errorf("no %s: %w", what, err)
	}
	return err
}

type alertEndpointCreateCmd struct {
	alertKeyFlag
	URL          string `name:"url" required:"" help:"Where events are POSTed: https:// at a public address (http:// only with --allow-http, a private address only with --allow-private)."`
	Description  string `name:"description" help:"What it is, for the list (up to 200 characters)."`
	AllowHTTP    bool   `name:"allow-http" env:"TOKENGATE_ALERT_ALLOW_HTTP" help:"Accept an http:// URL (development only; deliveries carry tenants' spending). Each serve replica needs --alert-allow-http to deliver to it."`
	AllowPrivate bool   `name:"allow-private" env:"TOKENGATE_ALERT_ALLOW_PRIVATE" help:"Accept a private, loopback or other non-public address. Each serve replica needs --alert-allow-private to deliver to it."`
	JSON         bool   `name:"json" help:"Print the endpoint and its secret as JSON."`
}

func (c alertEndpointCreateCmd) Run(ctx context.Context, g *globals) error {
	key, err := c.key()
	if err != nil {
		return err
	}
	return g.withAlerts(ctx, key, alert.Policy{AllowHTTP: c.AllowHTTP, AllowPrivate: c.AllowPrivate}, func(s *admin.Service) error {
		e, secret, err := s.AlertEndpointCreate(ctx, c.URL, c.Description)
		if err != nil {
			return err
		}
		if c.JSON {
			return json.NewEncoder(g.stdout).Encode(struct {
				alert.Endpoint
				Secret string `json:"secret"`
			}{e, secret})
		}
		printSecret(g.stdout, g.stderr, secret, fmt.Sprintf("endpoint %s for %s; its signing secret, shown once (derived from the alert key, never stored):", e.ID, e.URL))
		return nil
	})
}

type alertEndpointListCmd struct {
	JSON bool `name:"json" help:"Print the endpoints as JSON."`
}

func (c alertEndpointListCmd) Run(ctx context.Context, g *globals) error {
	return g.withAlerts(ctx, nil, alert.Policy{}, func(s *admin.Service) error {
		eps, err := s.AlertEndpointList(ctx)
		if err != nil {
			return err
		}
		if c.JSON {
			return json.NewEncoder(g.stdout).Encode(nonNil(eps))
		}
		w := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "ENDPOINT\tURL\tDESCRIPTION\tCREATED\tDISABLED\tPENDING\tFAILED")
		for _, e := range eps {
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%d\t%d\n", e.ID, e.URL, orDash(oneLine(e.Description, 60)), stamp(&e.CreatedAt),
				stamp(e.DisabledAt), e.Pending, e.Failed)
		}
		return w.Flush()
	})
}

type alertEndpointRotateCmd struct {
	alertKeyFlag
	ID string `arg:"" help:"Endpoint id (ep_...)."`
}

func (c alertEndpointRotateCmd) Run(ctx context.Context, g *globals) error {
	key, err := c.key()
	if err != nil {
		return err
	}
	return g.withAlerts(ctx, key, alert.Policy{}, func(s *admin.Service) error {
		secret, err := s.AlertEndpointRotate(ctx, c.ID)
		if err != nil {
			return notFound(err, "enabled endpoint "+c.ID)
		}
		printSecret(g.stdout, g.stderr, secret, fmt.Sprintf("endpoint %s: its new signing secret, shown once (the old one no longer signs):", c.ID))
		return nil
	})
}

type alertEndpointDisableCmd struct {
	ID string `arg:"" help:"Endpoint id (ep_...)."`
}

func (c alertEndpointDisableCmd) Run(ctx context.Context, g *globals) error {
	return g.withAlerts(ctx, nil, alert.Policy{}, func(s *admin.Service) error {
		if err := s.AlertEndpointDisable(ctx, c.ID); err != nil {
			return notFound(err, "enabled endpoint "+c.ID)
		}
		fmt.Fprintf(g.stderr, "disabled endpoint %s; its pending events will be recorded failed\n", c.ID)
		return nil
	})
}

type alertRuleCreateCmd struct {
	Endpoint   string  `name:"endpoint" required:"" help:"Endpoint id (ep_...) the rule's events go to."`
	Kind       string  `name:"kind" required:"" enum:"period_budget,throttled,invariant" help:"period_budget (--thresholds), throttled (--minutes, --limit) or invariant."`
	Tenant     string  `name:"tenant" help:"Tenant id (default: every tenant)."`
	Thresholds []int32 `name:"thresholds" sep:"," help:"period_budget: percentages of the period budget, e.g. 50,80,100."`
	Limit      string  `name:"limit" help:"throttled: the limit that refuses (tokens, requests, concurrency, period_budget, input_tokens, output_tokens, pool); default any."`
	Minutes    int32   `name:"minutes" help:"throttled: refused in each of this many minutes in a row (1 to 1440)."`
	JSON       bool    `name:"json" help:"Print the rule as JSON."`
}

func (c alertRuleCreateCmd) Run(ctx context.Context, g *globals) error {
	return g.withAlerts(ctx, nil, alert.Policy{}, func(s *admin.Service) error {
		r, err := s.AlertRuleCreate(ctx, alert.RuleParams{TenantID: c.Tenant, EndpointID: c.Endpoint, Kind: c.Kind,
			Thresholds: c.Thresholds, Limit: c.Limit, SustainMinutes: c.Minutes})
		if err != nil {
			return err
		}
		if c.JSON {
			return json.NewEncoder(g.stdout).Encode(r)
		}
		fmt.Fprintf(g.stderr, "created rule %d: %s, for %s, to %s\n", r.ID, ruleCondition(r), ruleTenant(r), r.EndpointID)
		fmt.Fprintln(g.stdout, r.ID)
		return nil
	})
}

type alertRuleListCmd struct {
	Tenant string `name:"tenant" help:"Only the rules that apply to this tenant (its own and those for every tenant)."`
	JSON   bool   `name:"json" help:"Print the rules as JSON."`
}

func (c alertRuleListCmd) Run(ctx context.Context, g *globals) error {
	return g.withAlerts(ctx, nil, alert.Policy{}, func(s *admin.Service) error {
		rules, err := s.AlertRuleList(ctx, c.Tenant)
		if err != nil {
			return err
		}
		if c.JSON {
			return json.NewEncoder(g.stdout).Encode(nonNil(rules))
		}
		w := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "RULE\tTENANT\tKIND\tWHEN\tENDPOINT\tCREATED")
		for _, r := range rules {
			tenant := "*"
			if r.TenantID != nil {
				tenant = *r.TenantID
			}
			fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\n", r.ID, tenant, r.Kind, ruleCondition(r), r.EndpointID, stamp(&r.CreatedAt))
		}
		return w.Flush()
	})
}

// ruleCondition says when a rule raises an event.
func ruleCondition(r alert.Rule) string {
	switch r.Kind {
	case alert.KindPeriodBudget:
		pcts := make([]string, len(r.Thresholds))
		for i, t := range r.Thresholds {
			pcts[i] = strconv.Itoa(int(t))
		}
		return strings.Join(pcts, ",") + "% of the period budget"
	case alert.KindThrottled:
		limit := "any limit"
		if r.Limit != nil {
			limit = *r.Limit
		}
		var minutes int32
		if r.SustainMinutes != nil {
			minutes = *r.SustainMinutes
		}
		return fmt.Sprintf("%s refusing for %d min", limit, minutes)
	case alert.KindInvariant:
		return "the ledger does not recompute"
	}
	return "-"
}

func ruleTenant(r alert.Rule) string {
	if r.TenantID == nil {
		return "every tenant"
	}
	return "tenant " + *r.TenantID
}

type alertRuleDeleteCmd struct {
	ID int64 `arg:"" help:"Rule id."`
}

func (c alertRuleDeleteCmd) Run(ctx context.Context, g *globals) error {
	return g.withAlerts(ctx, nil, alert.Policy{}, func(s *admin.Service) error {
		if err := s.AlertRuleDelete(ctx, c.ID); err != nil {
			return notFound(err, fmt.Sprintf("rule %d", c.ID))
		}
		fmt.Fprintf(g.stderr, "deleted rule %d; its events stay\n", c.ID)
		return nil
	})
}

type alertEventsCmd struct {
	Tenant   string `name:"tenant" help:"Only this tenant's events."`
	State    string `name:"state" enum:"pending,delivered,failed," default:"" help:"Only events in this state: pending, delivered or failed."`
	Endpoint string `name:"endpoint" help:"Only the events sent to this endpoint."`
	Limit    int    `name:"limit" default:"100" help:"Most events to list (1 to 1000)."`
	JSON     bool   `name:"json" help:"Print the events, with their payloads and attempts, as JSON."`
}

func (c alertEventsCmd) Run(ctx context.Context, g *globals) error {
	if c.Limit < 1 {
		return errors.New("--limit: must be from 1 to 1000")
	}
	return g.withAlerts(ctx, nil, alert.Policy{}, func(s *admin.Service) error {
		events, err := s.AlertEventList(ctx, alert.EventFilter{TenantID: c.Tenant, State: c.State, EndpointID: c.Endpoint, Limit: c.Limit})
		if err != nil {
			return err
		}
		if c.JSON {
			return json.NewEncoder(g.stdout).Encode(nonNil(events))
		}
		w := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "EVENT\tTENANT\tTYPE\tSTATE\tCREATED\tDETAIL\tENDPOINT\tATTEMPTS")
		for _, e := range events {
			head := fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s\t%s", e.ID, e.TenantID, e.Type, e.State, stamp(&e.CreatedAt), eventDetail(e), e.EndpointID)
			if len(e.Log) == 0 {
				fmt.Fprintf(w, "%s\t-\n", head)
			}
			// One line per attempt, the first beside the event.
			for i, a := range e.Log {
				if i > 0 {
					head = "\t\t\t\t\t\t"
				}
				fmt.Fprintf(w, "%s\t%s\n", head, attemptSummary(a))
			}
		}
		return w.Flush()
	})
}

// eventDetail summarises an event's payload by its type.
func eventDetail(e alert.Event) string {
	var d struct {
		Percent *int64  `json:"threshold_percent"`
		Budget  int64   `json:"period_budget"`
		Used    int64   `json:"period_used"`
		Limit   *string `json:"limit"`
		Minutes int64   `json:"minutes"`
		Refused int64   `json:"refused"`
		Entry   int64   `json:"entry"`
		Problem string  `json:"problem"`
	}
	if err := json.Unmarshal(e.Data, &d); err != nil {
		return "-"
	}
	switch e.Type {
	case alert.TypeThresholdCrossed:
		if d.Percent == nil {
			return "-"
		}
		return fmt.Sprintf("%d%%: %d/%d used", *d.Percent, d.Used, d.Budget)
	case alert.TypeThrottled:
		limit := "any limit"
		if d.Limit != nil {
			limit = *d.Limit
		}
		return fmt.Sprintf("%s refused %d times in %d min", limit, d.Refused, d.Minutes)
	case alert.TypeInvariantViolated:
		return oneLine(fmt.Sprintf("entry %d: %s", d.Entry, d.Problem), 60)
	}
	return "-"
}

// attemptSummary is one delivery attempt: number, outcome, HTTP status,
// duration and error, e.g. "#2 failed 503 120ms: upstream down".
func attemptSummary(a alert.Attempt) string {
	s := fmt.Sprintf("#%d %s", a.Attempt, a.Outcome)
	if a.StatusCode != nil {
		s += " " + strconv.Itoa(*a.StatusCode)
	}
	if a.DurationMS != nil {
		s += fmt.Sprintf(" %dms", *a.DurationMS)
	}
	if a.Error != nil && *a.Error != "" {
		s += ": " + oneLine(*a.Error, 80)
	}
	return s
}

// oneLine folds s onto one line (a tab or newline would break the table)
// and cuts it to n runes.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

// nonNil makes an empty list encode as [] rather than null.
func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

type alertRedeliverCmd struct {
	ID string `arg:"" help:"Event id (evt_...) of a failed event."`
}

func (c alertRedeliverCmd) Run(ctx context.Context, g *globals) error {
	return g.withAlerts(ctx, nil, alert.Policy{}, func(s *admin.Service) error {
		if err := s.AlertEventRedeliver(ctx, c.ID); err != nil {
			return notFound(err, "failed event "+c.ID+" of an enabled endpoint (only failed events are redelivered)")
		}
		fmt.Fprintf(g.stderr, "event %s is due for delivery again\n", c.ID)
		return nil
	})
}
