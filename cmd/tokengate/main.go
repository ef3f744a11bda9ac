// Command tokengate is the cost-based admission controller: its HTTP server,
// its migrations and its bootstrap commands. main only wires configuration,
// the pool and the packages together; the logic lives in those packages.
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/alecthomas/kong"

	"github.com/tokengate/tokengate/api"
	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/admission"
	"github.com/tokengate/tokengate/budget/lease"
	"github.com/tokengate/tokengate/budget/replica"
)

// globals are the settings every command shares.
type globals struct {
	DatabaseURL string        `name:"database-url" env:"TOKENGATE_DATABASE_URL" help:"Postgres connection string (every command but loadgen). Several hosts fail over: postgres://u:p@a,b,c/db (connections go to the one that takes writes)."`
	ReadURL     string        `name:"read-database-url" env:"TOKENGATE_READ_DATABASE_URL" help:"Optional Postgres connection string for reads that may lag: ledger queries, exports, drift reports and the dashboard's tallies, e.g. postgres://u:p@a,b,c/db?target_session_attrs=prefer-standby. Decisions never read from it."`
	LogLevel    string        `name:"log-level" env:"TOKENGATE_LOG_LEVEL" default:"info" enum:"debug,info,warn,error" help:"Log level (${enum})."`
	Wait        time.Duration `name:"wait" env:"TOKENGATE_DB_WAIT" default:"30s" help:"How long to wait for the database to accept connections at start."`

	// stdout receives secrets and data; stderr receives notes and logs.
	stdout, stderr io.Writer
}

type cli struct {
	globals

	Migrate    migrateCmd    `cmd:"" help:"Apply pending database migrations."`
	Serve      serveCmd      `cmd:"" help:"Run the HTTP server."`
	Proxy      proxyCmd      `cmd:"" help:"Serve with the OpenAI-compatible proxy on (--proxy-addr, default :8082): admit, forward to --upstream, settle from its usage."`
	Tenant     tenantCmd     `cmd:"" help:"Manage tenants."`
	Key        keyCmd        `cmd:"" help:"Manage tenant API keys."`
	EndUsers   endUsersCmd   `cmd:"" name:"end-users" help:"Manage a tenant's end users: leaf budgets made on first sight from its end-user policy."`
	Model      modelCmd      `cmd:"" help:"Manage the model table."`
	Prices     pricesCmd     `cmd:"" help:"Manage the money price table (per model, per million tokens, effective-from rows never changed in place)."`
	Ledger     ledgerCmd     `cmd:"" help:"Verify and report on the ledger."`
	AdminToken adminTokenCmd `cmd:"" name:"admin-token" help:"Manage admin tokens (admin API and dashboard)."`
	Gateway    gatewayCmd    `cmd:"" help:"Manage gateway credentials (the rate limit service, serve --rls-addr)."`
	Pool       poolCmd       `cmd:"" help:"Manage upstream capacity pools, shared by tenants in weighted fair shares."`
	Alert      alertCmd      `cmd:"" help:"Manage budget alerts: webhook endpoints, rules, and the events sent to them."`
	Loadgen    loadgenCmd    `cmd:"" help:"Drive a running tokengate like a gateway and report throughput and latency."`
	Demo       demoCmd       `cmd:"" hidden:"" help:"Seed a demo tenant and key when the database has no tenant (make run)."`
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "tokengate:", err)
		os.Exit(1)
	}
}

// run parses args and runs the chosen command until ctx ends.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c := cli{globals: globals{stdout: stdout, stderr: stderr}}
	parser, err := kong.New(&c,
		kong.Name("tokengate"),
		kong.Description("Cost-based admission control for LLM inference."),
		kong.UsageOnError(),
		// Defaults named once, in the packages that apply them.
		kong.Vars{
			"body_limit":        strconv.Itoa(api.DefaultBodyLimit),
			"body_read_timeout": api.DefaultBodyReadTimeout.String(),
			"max_waiters":       strconv.Itoa(admission.DefaultMaxWaiters),
			"pipelines":         strconv.Itoa(admission.DefaultPipelines),
			"gather":            admission.DefaultGather.String(),
			"lease_ttl":         lease.DefaultTTL.String(),
			"lease_slice":       strconv.Itoa(replica.DefaultLeaseMinSlice),
			"lease_open_max":    strconv.Itoa(replica.DefaultLeaseOpenMax),
			"store_timeout":     account.DefaultStoreTimeout.String(),
			"window_help":       windowFlagHelp,
		},
	)
	if err != nil {
		return err
	}
	kctx, err := parser.Parse(args)
	if err != nil {
		return err
	}
	kctx.BindTo(ctx, (*context.Context)(nil))
	return kctx.Run(&c.globals)
}

func (g *globals) logger() *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(g.LogLevel))
	return slog.New(slog.NewJSONHandler(g.stderr, &slog.HandlerOptions{Level: level}))
}
