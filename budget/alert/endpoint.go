package alert

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/base32"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

var (
	//go:embed sql/endpoint_insert.sql
	endpointInsertSQL string
	//go:embed sql/endpoint_list.sql
	endpointListSQL string
	//go:embed sql/endpoint_rotate.sql
	endpointRotateSQL string
	//go:embed sql/endpoint_disable.sql
	endpointDisableSQL string
)

// Store manages endpoints, rules and the outbox.
type Store struct {
	pool *pgxpool.Pool
	key  []byte
	// Policy is where this replica creates endpoints and delivers
	// (https:// and public addresses only, by default). Its dispatcher
	// checks it again at every delivery.
	Policy
}

// NewStore returns a Store. key is the server's alert key, from which
// every endpoint's signing secret is derived; without one (nil) endpoints
// cannot be created and nothing can be signed.
func NewStore(pool *pgxpool.Pool, key []byte) *Store {
	return &Store{pool: pool, key: key}
}

// HasKey reports whether the store can give endpoints secrets and sign
// deliveries: without a key, alerts are off.
func (s *Store) HasKey() bool { return len(s.key) > 0 }

// Endpoint is where events are delivered.
type Endpoint struct {
	ID          string     `json:"id"`
	URL         string     `json:"url"`
	Description string     `json:"description"`
	CreatedAt   time.Time  `json:"created_at"`
	DisabledAt  *time.Time `json:"disabled_at,omitempty"`
	// Pending and Failed count its events waiting for delivery and given
	// up on (List only).
	Pending int64 `json:"pending"`
	Failed  int64 `json:"failed"`
}

func randomID(prefix string) string {
	b := make([]byte, 10)
	_, _ = rand.Read(b)
	return prefix + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b))
}

func (s *Store) checkURL(raw string) error {
	if err := storable("url", raw); err != nil {
		return err
	}
	u, err := url.Parse(raw)
	switch {
	case raw == "":
		return invalid("url", "is required")
	case err != nil || u.Host == "" || u.User != nil || u.Fragment != "":
		return invalid("url", "must be an absolute URL with a host, no credentials and no fragment")
	}
	if err := s.checkScheme(u); err != nil {
		return err
	}
	if err := s.checkHost(u); err != nil {
		return err
	}
	if len(raw) > 2000 {
		return invalid("url", "is longer than 2000 characters")
	}
	return nil
}

// CreateEndpoint adds an endpoint and returns its signing secret, which is
// shown this once: it is derived again to sign, never stored.
func (s *Store) CreateEndpoint(ctx context.Context, rawURL, description string) (Endpoint, string, error) {
	if len(s.key) == 0 {
		return Endpoint{}, "", ErrNoKey
	}
	if err := s.checkURL(rawURL); err != nil {
		return Endpoint{}, "", err
	}
	if err := storable("description", description); err != nil {
		return Endpoint{}, "", err
	}
	if len(description) > 200 {
		return Endpoint{}, "", invalid("description", "is longer than 200 characters")
	}
	id, salt := randomID("ep_"), make([]byte, 16)
	_, _ = rand.Read(salt)
	rows, _ := s.pool.Query(ctx, endpointInsertSQL, id, rawURL, description, salt)
	e, err := pgx.CollectExactlyOneRow(rows, pgx.RowToStructByPos[endpointRow])
	if err != nil {
		return Endpoint{}, "", fmt.Errorf("alert: create endpoint: %w", err)
	}
	return e.endpoint(), deriveSecret(s.key, id, salt), nil
}

type endpointRow struct {
	ID          string
	URL         string
	Description string
	CreatedAt   time.Time
	DisabledAt  *time.Time
}

func (r endpointRow) endpoint() Endpoint {
	return Endpoint{ID: r.ID, URL: r.URL, Description: r.Description, CreatedAt: r.CreatedAt, DisabledAt: r.DisabledAt}
}

// Endpoints lists every endpoint, disabled ones too (their log stays).
func (s *Store) Endpoints(ctx context.Context) ([]Endpoint, error) {
	rows, _ := s.pool.Query(ctx, endpointListSQL)
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Endpoint, error) {
		var e Endpoint
		err := r.Scan(&e.ID, &e.URL, &e.Description, &e.CreatedAt, &e.DisabledAt, &e.Pending, &e.Failed)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("alert: endpoints: %w", err)
	}
	return out, nil
}

// RotateSecret gives an endpoint a new secret and returns it; the old one
// stops signing at once (deliveries in flight keep the signature they had).
func (s *Store) RotateSecret(ctx context.Context, id string) (string, error) {
	if len(s.key) == 0 {
		return "", ErrNoKey
	}
	if storable("id", id) != nil {
		return "", ErrNotFound // no endpoint has such an id
	}
	salt := make([]byte, 16)
	_, _ = rand.Read(salt)
	tag, err := s.pool.Exec(ctx, endpointRotateSQL, id, salt)
	if err != nil {
		return "", fmt.Errorf("alert: rotate %s: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return "", ErrNotFound
	}
	return deriveSecret(s.key, id, salt), nil
}

// DisableEndpoint stops deliveries to an endpoint: its rules stop raising
// events, and the dispatcher gives up its pending ones (recorded failed,
// "endpoint disabled"). Its log stays.
func (s *Store) DisableEndpoint(ctx context.Context, id string) error {
	if storable("id", id) != nil {
		return ErrNotFound
	}
	tag, err := s.pool.Exec(ctx, endpointDisableSQL, id)
	if err != nil {
		return fmt.Errorf("alert: disable %s: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return ErrNotFound
	}
	return nil
}

func isFK(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == pgerrcode.ForeignKeyViolation
}
