package admin

import (
	"errors"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/alert"
	"github.com/tokengate/tokengate/budget/batch"
	"github.com/tokengate/tokengate/budget/lease"
	"github.com/tokengate/tokengate/estimator"
	"github.com/tokengate/tokengate/ledger"
)

// Config configures a Service. DB is required; nil fields take defaults.
type Config struct {
	// DB is the primary: every change and every read that must not lag.
	// It belongs to the caller.
	DB *pgxpool.Pool
	// Reads is where the reads that may lag go (ledger queries, exports,
	// window spend): a streaming replica, or DB. Nil: DB.
	Reads ledger.Querier
	// Store is the budget store the tenants' changes go through. Nil: a
	// new account.Store on DB.
	Store *account.Store
	// Estimator is the replica's: a saved model applies to it at once
	// (other replicas follow within their refresh interval). Nil: a saved
	// model reloads no table (the CLI).
	Estimator *estimator.Estimator
	// Alerts manages alert endpoints, rules and events. Nil: a store on DB
	// without a key (endpoints cannot be created).
	Alerts *alert.Store
	// Batches sets the tenants' batch allowances. Nil: a batch.Service on
	// Store.
	Batches *batch.Service
	// Leases sets the tenants' lease modes. Nil: a lease.Store on Store.
	Leases *lease.Store
	// Logger records what an operation tolerates failing (an admin token's
	// last use). Defaults to slog.Default().
	Logger *slog.Logger
}

// Service is the administration of one tokengate database. It is safe for
// concurrent use.
type Service struct {
	db     *pgxpool.Pool
	reads  ledger.Querier
	store  *account.Store
	est    *estimator.Estimator
	alerts *alert.Store
	logger *slog.Logger

	// batches is the batch use case, for the allowance (batch.go).
	batches *batch.Service

	// leases is quota leasing, for the tenants' lease modes (lease.go).
	leases *lease.Store
}

// New builds a Service on cfg.
func New(cfg Config) (*Service, error) {
	if cfg.DB == nil {
		return nil, errors.New("admin: Config.DB is required")
	}
	if cfg.Reads == nil {
		cfg.Reads = cfg.DB
	}
	if cfg.Store == nil {
		cfg.Store = account.NewStore(cfg.DB)
	}
	if cfg.Alerts == nil {
		cfg.Alerts = alert.NewStore(cfg.DB, nil)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Batches == nil {
		b, err := batch.New(batch.Config{Store: cfg.Store, Estimator: cfg.Estimator})
		if err != nil {
			return nil, err
		}
		cfg.Batches = b
	}
	if cfg.Leases == nil {
		l, err := lease.New(lease.Config{Store: cfg.Store})
		if err != nil {
			return nil, err
		}
		cfg.Leases = l
	}
	return &Service{db: cfg.DB, reads: cfg.Reads, store: cfg.Store, est: cfg.Estimator, alerts: cfg.Alerts, logger: cfg.Logger, batches: cfg.Batches,
		leases: cfg.Leases}, nil
}
