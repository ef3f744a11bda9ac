package alert

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

var (
	//go:embed sql/event_list.sql
	eventListSQL string
	//go:embed sql/event_redeliver.sql
	eventRedeliverSQL string
	//go:embed sql/throttled_raise.sql
	throttledRaiseSQL string
	//go:embed sql/invariant_raise.sql
	invariantRaiseSQL string
)

// Event is an outbox row with its delivery log.
type Event struct {
	ID            string          `json:"id"`
	RuleID        int64           `json:"rule"`
	EndpointID    string          `json:"endpoint"`
	TenantID      string          `json:"tenant"`
	Type          string          `json:"type"`
	Data          json.RawMessage `json:"data"`
	CreatedAt     time.Time       `json:"created_at"`
	State         string          `json:"state"` // pending, delivered, failed
	Attempts      int             `json:"attempts"`
	NextAttemptAt time.Time       `json:"next_attempt_at"`
	DeliveredAt   *time.Time      `json:"delivered_at,omitempty"`
	Log           []Attempt       `json:"log"`
}

// Attempt is one delivery attempt.
type Attempt struct {
	Attempt    int        `json:"attempt"`
	Replica    string     `json:"replica"`
	StartedAt  time.Time  `json:"started_at"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
	// Outcome: in_flight, delivered, failed, abandoned, superseded.
	Outcome    string  `json:"outcome"`
	StatusCode *int    `json:"status_code,omitempty"`
	Error      *string `json:"error,omitempty"`
	DurationMS *int    `json:"duration_ms,omitempty"`
}

// EventFilter narrows Events; zero fields match everything.
type EventFilter struct {
	TenantID, State, EndpointID string
	Limit                       int // default 100, at most 1000
}

// Events lists events, newest first, with their attempts.
func (s *Store) Events(ctx context.Context, f EventFilter) ([]Event, error) {
	switch f.State {
	case "", "pending", "delivered", "failed":
	default:
		return nil, invalid("state", "must be pending, delivered or failed")
	}
	if err := storable("tenant", f.TenantID); err != nil {
		return nil, err
	}
	if err := storable("endpoint", f.EndpointID); err != nil {
		return nil, err
	}
	if f.Limit < 0 || f.Limit > 1000 {
		return nil, invalid("limit", "must be from 1 to 1000")
	}
	rows, _ := s.pool.Query(ctx, eventListSQL, nullable(f.TenantID), nullable(f.State), nullable(f.EndpointID), orDefault(f.Limit, 100))
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Event, error) {
		var e Event
		var log []byte
		err := r.Scan(&e.ID, &e.RuleID, &e.EndpointID, &e.TenantID, &e.Type, &e.Data, &e.CreatedAt, &e.State, &e.Attempts,
			&e.NextAttemptAt, &e.DeliveredAt, &log)
		if err == nil {
			err = json.Unmarshal(log, &e.Log)
		}
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("alert: events: %w", err)
	}
	return out, nil
}

// Redeliver puts an event that was given up (failed) back in the outbox,
// due now. Delivered events are not sent again: each is recorded
// delivered once.
func (s *Store) Redeliver(ctx context.Context, id string) error {
	if storable("id", id) != nil {
		return ErrNotFound // no event has such an id
	}
	tag, err := s.pool.Exec(ctx, eventRedeliverSQL, id)
	if err != nil {
		return fmt.Errorf("alert: redeliver %s: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return ErrNotFound
	}
	return nil
}

// RaiseThrottled writes the events of throttled rules whose tenants were
// refused in each of their last sustain_minutes complete minutes before
// now (the database's clock when now is zero). Every replica runs it
// every few seconds; it returns how many events it wrote. It reads
// budget's rejection tallies (rejection_counts), which replicas flush
// every few seconds, so an episode is seen within seconds of its minute.
func (s *Store) RaiseThrottled(ctx context.Context, now time.Time) (int64, error) {
	var at *time.Time
	if !now.IsZero() {
		at = &now
	}
	tag, err := s.pool.Exec(ctx, throttledRaiseSQL, at)
	if err != nil {
		return 0, fmt.Errorf("alert: raise throttled: %w", err)
	}
	return tag.RowsAffected(), nil
}

// RaiseInvariant writes the events of invariant rules for a tenant the
// ledger watch found wrong at entry seq; it returns how many it wrote.
func (s *Store) RaiseInvariant(ctx context.Context, tenantID string, seq int64, problem string) (int64, error) {
	tag, err := s.pool.Exec(ctx, invariantRaiseSQL, tenantID, seq, problem)
	if err != nil {
		return 0, fmt.Errorf("alert: raise invariant: %w", err)
	}
	return tag.RowsAffected(), nil
}
