package migrations

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

//go:embed *.sql
var files embed.FS

// ErrPending is returned by Check when the database lacks migrations that
// this binary ships. `tokengate migrate` applies them.
var ErrPending = errors.New("database migrations are pending: run `tokengate migrate` (or `tokengate serve --migrate`)")

// Migrator applies and inspects the embedded migrations on one database.
type Migrator struct {
	db       *sql.DB
	provider *goose.Provider
}

// New returns a Migrator that talks to the database through pool. Close
// releases the database/sql handle it wraps around the pool; the pool itself
// stays open.
func New(pool *pgxpool.Pool, logger *slog.Logger) (*Migrator, error) {
	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		return nil, fmt.Errorf("migrations: session locker: %w", err)
	}
	opts := []goose.ProviderOption{goose.WithSessionLocker(locker)}
	if logger != nil {
		opts = append(opts, goose.WithSlog(logger))
	}
	db := stdlib.OpenDBFromPool(pool)
	provider, err := goose.NewProvider(goose.DialectPostgres, db, files, opts...)
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("migrations: provider: %w", err)
	}
	return &Migrator{db: db, provider: provider}, nil
}

// Up applies every pending migration and returns the versions it applied.
// Running it on an up-to-date database changes nothing and returns none.
func (m *Migrator) Up(ctx context.Context) ([]int64, error) {
	results, err := m.provider.Up(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrations: up: %w", err)
	}
	applied := make([]int64, 0, len(results))
	for _, r := range results {
		applied = append(applied, r.Source.Version)
	}
	return applied, nil
}

// UpTo applies the pending migrations up to version, and no further: an
// upgrade is tested from the schema a release before it left, with the data
// that release wrote.
func (m *Migrator) UpTo(ctx context.Context, version int64) error {
	if _, err := m.provider.UpTo(ctx, version); err != nil {
		return fmt.Errorf("migrations: up to %d: %w", version, err)
	}
	return nil
}

// Check returns ErrPending when the database is behind this binary, and a
// wrapped connection error when the database cannot be asked.
func (m *Migrator) Check(ctx context.Context) error {
	pending, err := m.provider.HasPending(ctx)
	if err != nil {
		return fmt.Errorf("migrations: check: %w", err)
	}
	if pending {
		return ErrPending
	}
	return nil
}

// Version returns the newest applied version and the newest embedded one.
func (m *Migrator) Version(ctx context.Context) (current, target int64, err error) {
	current, target, err = m.provider.GetVersions(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("migrations: versions: %w", err)
	}
	return current, target, nil
}

// Close releases the database/sql handle.
func (m *Migrator) Close() error {
	return m.db.Close()
}
