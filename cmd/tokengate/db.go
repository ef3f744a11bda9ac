// db.go: the database edge of every command: opening pools, migrating,
// and the one-shot commands' admin service.

package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tokengate/tokengate/budget/admin"
	"github.com/tokengate/tokengate/ledger/pgarray"
	"github.com/tokengate/tokengate/migrations"
)

// pool opens the pool and waits up to --wait for the database to answer, so
// that `make run` and container start-up need no separate wait loop.
func (g *globals) pool(ctx context.Context, logger *slog.Logger, maxConns int32) (*pgxpool.Pool, error) {
	if g.DatabaseURL == "" {
		return nil, errors.New("set TOKENGATE_DATABASE_URL or --database-url")
	}
	cfg, err := pgxpool.ParseConfig(g.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("parse TOKENGATE_DATABASE_URL: %w", err)
	}
	if cfg.ConnConfig.ValidateConnect == nil {
		// Every connection of this pool writes: whatever the URL says
		// (no target_session_attrs, or any), a node that does not take
		// writes (a standby, a primary demoted by a failover) is skipped
		// for the next host, as target_session_attrs=read-write does.
		cfg.ConnConfig.ValidateConnect = pgconn.ValidateConnectTargetSessionAttrsReadWrite
	}
	return g.open(ctx, logger, cfg, maxConns)
}

// readPool opens the pool of --read-database-url, or returns nil when it
// is not set. Its connections may go to a standby, or to the primary when
// the URL allows it (target_session_attrs=prefer-standby).
func (g *globals) readPool(ctx context.Context, logger *slog.Logger, maxConns int32) (*pgxpool.Pool, error) {
	if g.ReadURL == "" {
		return nil, nil
	}
	cfg, err := pgxpool.ParseConfig(g.ReadURL)
	if err != nil {
		return nil, fmt.Errorf("parse TOKENGATE_READ_DATABASE_URL: %w", err)
	}
	return g.open(ctx, logger, cfg, maxConns)
}

// open opens a pool on cfg and waits up to --wait for it to answer.
func (g *globals) open(ctx context.Context, logger *slog.Logger, cfg *pgxpool.Config, maxConns int32) (*pgxpool.Pool, error) {
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	pgarray.Configure(cfg)
	if cfg.ConnConfig.ConnectTimeout == 0 || cfg.ConnConfig.ConnectTimeout > 2*time.Second {
		// A black-holed database must not hold a request until the OS
		// gives up on the connection (per host of a multi-host URL).
		cfg.ConnConfig.ConnectTimeout = 2 * time.Second
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open pool: %w", err)
	}
	deadline := time.Now().Add(g.Wait)
	for {
		// A connect timeout per host: a dead first host of a multi-host
		// URL must leave time for the others.
		pingCtx, cancel := context.WithTimeout(ctx, time.Second+cfg.ConnConfig.ConnectTimeout*time.Duration(1+len(cfg.ConnConfig.Fallbacks)))
		err = pool.Ping(pingCtx)
		cancel()
		if err == nil {
			return pool, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			pool.Close()
			return nil, fmt.Errorf("database %s:%d not reachable after %s: %w", cfg.ConnConfig.Host, cfg.ConnConfig.Port, g.Wait, err)
		}
		logger.Info("waiting for the database", "host", cfg.ConnConfig.Host, "port", cfg.ConnConfig.Port)
		select {
		case <-ctx.Done():
		case <-time.After(500 * time.Millisecond):
		}
	}
}

type migrateCmd struct{}

func (migrateCmd) Run(ctx context.Context, g *globals) error {
	logger := g.logger()
	pool, err := g.pool(ctx, logger, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	return migrate(ctx, pool, logger)
}

func migrate(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) error {
	m, err := migrations.New(pool, logger)
	if err != nil {
		return err
	}
	defer m.Close()
	applied, err := m.Up(ctx)
	if err != nil {
		return err
	}
	current, _, err := m.Version(ctx)
	if err != nil {
		return err
	}
	logger.Info("migrations applied", "applied", applied, "version", current)
	return nil
}

func checkMigrations(ctx context.Context, pool *pgxpool.Pool) error {
	m, err := migrations.New(pool, nil)
	if err != nil {
		return err
	}
	defer m.Close()
	if err := m.Check(ctx); err != nil {
		if errors.Is(err, migrations.ErrPending) {
			return fmt.Errorf("refusing to start: %w", err)
		}
		return err
	}
	return nil
}

// withPool runs fn with a small pool on the database, for the one-shot
// commands.
func (g *globals) withPool(ctx context.Context, fn func(*pgxpool.Pool) error) error {
	pool, err := g.pool(ctx, g.logger(), 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	return fn(pool)
}

// withAdmin runs fn with the admin service on a small pool, for the
// one-shot commands: they make the calls the API and the dashboard make.
func (g *globals) withAdmin(ctx context.Context, fn func(*admin.Service) error) error {
	return g.withPool(ctx, g.adminOn(fn))
}

// withReadAdmin is withAdmin on --read-database-url when it is set, for
// the one-shot commands that only read what may lag (the drift report).
func (g *globals) withReadAdmin(ctx context.Context, fn func(*admin.Service) error) error {
	return g.withReadPool(ctx, g.adminOn(fn))
}

// adminOn runs fn with the admin service on the pool it is given.
func (g *globals) adminOn(fn func(*admin.Service) error) func(*pgxpool.Pool) error {
	return func(pool *pgxpool.Pool) error {
		svc, err := admin.New(admin.Config{DB: pool, Logger: g.logger()})
		if err != nil {
			return err
		}
		return fn(svc)
	}
}

// withReadPool is withPool on --read-database-url when it is set: for
// the one-shot commands that only read what may lag (the drift report).
func (g *globals) withReadPool(ctx context.Context, fn func(*pgxpool.Pool) error) error {
	if g.ReadURL == "" {
		return g.withPool(ctx, fn)
	}
	pool, err := g.readPool(ctx, g.logger(), 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	return fn(pool)
}
