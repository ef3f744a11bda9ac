package main

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tokengate/tokengate/budget/alert"
)

// alertFlags configure budget alerts: the key that signing secrets derive
// from, and how the dispatcher delivers.
type alertFlags struct {
	Key          string        `name:"alert-key" env:"TOKENGATE_ALERT_KEY" help:"Secret (32 bytes or more) from which every alert endpoint's signing secret is derived; the same on every replica. Without it alerts are off. Never logged."`
	AllowHTTP    bool          `name:"alert-allow-http" env:"TOKENGATE_ALERT_ALLOW_HTTP" help:"Accept and deliver to http:// alert endpoints (development only; deliveries carry tenants' spending). Each replica checks its own flag at every delivery."`
	AllowPrivate bool          `name:"alert-allow-private" env:"TOKENGATE_ALERT_ALLOW_PRIVATE" help:"Accept and deliver to alert endpoints at private, loopback, link-local and other non-public addresses (a receiver inside your network). Each replica checks its own flag on every connection."`
	Interval     time.Duration `name:"alert-interval" env:"TOKENGATE_ALERT_INTERVAL" default:"1s" help:"How often this replica looks for alert events to deliver and for sustained throttling."`
	Timeout      time.Duration `name:"alert-timeout" env:"TOKENGATE_ALERT_TIMEOUT" default:"10s" help:"How long a webhook may take to answer."`
	Lease        time.Duration `name:"alert-lease" env:"TOKENGATE_ALERT_LEASE" default:"30s" help:"How long a replica owns an event it delivers; another replica takes it over after (must exceed --alert-timeout)."`
	Backoff      time.Duration `name:"alert-backoff" env:"TOKENGATE_ALERT_BACKOFF" default:"1s" help:"Wait after a failed delivery; it doubles each attempt (with jitter) up to 10 min."`
	GiveUp       time.Duration `name:"alert-give-up" env:"TOKENGATE_ALERT_GIVE_UP" default:"24h" help:"Age at which an undelivered event is recorded failed (an admin may redeliver it)."`
}

// withDefaults fills what kong did not (a serveCmd built in code).
func (a alertFlags) withDefaults() alertFlags {
	if a.Interval <= 0 {
		a.Interval = time.Second
	}
	if a.Timeout <= 0 {
		a.Timeout = 10 * time.Second
	}
	if a.Lease <= 0 {
		a.Lease = 30 * time.Second
	}
	return a
}

// store returns the alert store, with its key when one is set.
func (a alertFlags) store(pool *pgxpool.Pool) (*alert.Store, error) {
	a = a.withDefaults()
	var key []byte
	if a.Key != "" {
		if len(a.Key) < 32 {
			return nil, errors.New("--alert-key must be at least 32 bytes")
		}
		key = []byte(a.Key)
	}
	if a.Lease <= a.Timeout {
		return nil, errors.New("--alert-lease must exceed --alert-timeout")
	}
	s := alert.NewStore(pool, key)
	s.Policy = alert.Policy{AllowHTTP: a.AllowHTTP, AllowPrivate: a.AllowPrivate}
	return s, nil
}

// run delivers the outbox and raises sustained-throttling events until ctx
// ends. Without a key it only warns: nothing can be signed.
func (a alertFlags) run(ctx context.Context, s *alert.Store, replica string, logger *slog.Logger) {
	a = a.withDefaults()
	if a.Key == "" {
		logger.Warn("alerts are off: set --alert-key (TOKENGATE_ALERT_KEY) to deliver them")
		return
	}
	d := &alert.Dispatcher{Store: s, Replica: replica, Client: &http.Client{Timeout: a.Timeout}, Lease: a.Lease,
		Base: a.Backoff, GiveUpAfter: a.GiveUp, Logger: logger}
	// Throttling is counted in minutes: every 10 s is soon enough.
	go every(ctx, 10*time.Second, logger, "sustained throttling alerts", func(ctx context.Context) error {
		_, err := s.RaiseThrottled(ctx, time.Time{})
		return err
	})
	d.Run(ctx, a.Interval)
}
