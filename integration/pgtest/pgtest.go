package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	dockercontainer "github.com/moby/moby/api/types/container"
	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"

	"github.com/tokengate/tokengate/ledger/pgarray"
	"github.com/tokengate/tokengate/migrations"
)

// DefaultImage is the locally built image; see integration/pgimage.
const DefaultImage = "tc.local/postgres:15-bookworm"

var (
	mainCalled bool

	startOnce sync.Once
	startErr  error
	server    *url.URL // admin connection to the maintenance database
	container *tcpostgres.PostgresContainer
	admin     *pgxpool.Pool
	template  string

	// createMu serialises CREATE DATABASE .. TEMPLATE: Postgres refuses to
	// copy a template that another session is copying from at that moment.
	createMu sync.Mutex
)

// DockerDefaults sets testcontainers' settings for a machine with no
// registry, where unset. The Makefile sets them; defaulting them here lets
// a plain `go test` work too: the reaper image cannot be pulled, and with a
// /.dockerenv testcontainers would dial the bridge gateway. Packages that
// start their own containers call it from TestMain.
func DockerDefaults() {
	if os.Getenv("TESTCONTAINERS_RYUK_DISABLED") == "" {
		_ = os.Setenv("TESTCONTAINERS_RYUK_DISABLED", "true")
	}
	if _, err := os.Stat("/.dockerenv"); err == nil && os.Getenv("TESTCONTAINERS_HOST_OVERRIDE") == "" {
		_ = os.Setenv("TESTCONTAINERS_HOST_OVERRIDE", "localhost")
	}
}

// Main runs m and then stops the Postgres container, if one was started.
// The container starts lazily, on the first test that asks for a database,
// so packages whose selected tests need none pay nothing.
func Main(m *testing.M) {
	mainCalled = true
	DockerDefaults()
	code := m.Run()
	if admin != nil {
		if code == 0 && template != "" {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			_, _ = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{template}.Sanitize()+" WITH (FORCE)")
			cancel()
		}
		admin.Close()
	}
	if container != nil {
		if err := testcontainers.TerminateContainer(container); err != nil {
			log.Printf("pgtest: terminate container: %v", err)
		}
	}
	os.Exit(code)
}

func start() error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	raw := os.Getenv("TOKENGATE_TEST_DATABASE_URL")
	if raw == "" {
		image := os.Getenv("PG_IMAGE")
		if image == "" {
			image = DefaultImage
		}
		args := []string{"-c", "max_connections=500"}
		// Durability is the production contract, not what unit tests check;
		// benchmarks set TOKENGATE_TEST_PG_DURABLE=1 to keep fsync on.
		if os.Getenv("TOKENGATE_TEST_PG_DURABLE") == "" {
			args = append(args, "-c", "fsync=off", "-c", "full_page_writes=off", "-c", "synchronous_commit=off")
		}
		ctr, err := tcpostgres.Run(ctx, image,
			// Parallel queries share memory through /dev/shm, which Docker
			// sizes at 64 MB by default: too little for large sorts.
			testcontainers.WithHostConfigModifier(func(hc *dockercontainer.HostConfig) { hc.ShmSize = 1 << 30 }),
			tcpostgres.WithDatabase("postgres"),
			tcpostgres.WithUsername("postgres"),
			tcpostgres.WithPassword("postgres"),
			tcpostgres.BasicWaitStrategies(),
			testcontainers.WithCmdArgs(args...),
		)
		container = ctr
		if err != nil {
			return fmt.Errorf("pgtest: start %s (run `make pg-image` to build it): %w", image, err)
		}
		raw, err = ctr.ConnectionString(ctx, "sslmode=disable")
		if err != nil {
			return fmt.Errorf("pgtest: connection string: %w", err)
		}
	}
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("pgtest: parse server url: %w", err)
	}
	server = u
	admin, err = pgxpool.New(ctx, raw)
	if err != nil {
		return fmt.Errorf("pgtest: admin pool: %w", err)
	}
	if err := admin.Ping(ctx); err != nil {
		return fmt.Errorf("pgtest: ping %s: %w", u.Redacted(), err)
	}

	// Migrate once into a template that this binary owns.
	template = "tpl_" + randomSuffix()
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{template}.Sanitize()); err != nil {
		return fmt.Errorf("pgtest: create template: %w", err)
	}
	tplPool, err := pgxpool.New(ctx, urlFor(template))
	if err != nil {
		return fmt.Errorf("pgtest: template pool: %w", err)
	}
	defer tplPool.Close()
	m, err := migrations.New(tplPool, nil)
	if err != nil {
		return err
	}
	defer m.Close()
	if _, err := m.Up(ctx); err != nil {
		return fmt.Errorf("pgtest: migrate template: %w", err)
	}
	return nil
}

func ensureStarted(t testing.TB) {
	t.Helper()
	if !mainCalled {
		t.Fatal("pgtest: the package needs `func TestMain(m *testing.M) { pgtest.Main(m) }`")
	}
	startOnce.Do(func() { startErr = start() })
	if startErr != nil {
		// Never skip: a missing database is a broken environment.
		t.Fatal(startErr)
	}
}

func urlFor(db string) string {
	u := *server
	u.Path = "/" + db
	return u.String()
}

func randomSuffix() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// URL creates a fresh database cloned from the migrated template and returns
// its connection string. The database is dropped when t passes.
func URL(t testing.TB) string {
	t.Helper()
	return newDatabase(t, true)
}

// EmptyURL creates a fresh database with no schema at all, for tests of the
// migrations themselves.
func EmptyURL(t testing.TB) string {
	t.Helper()
	return newDatabase(t, false)
}

// New returns a pool on a fresh migrated database. Config may adjust the pool
// (for example MaxConns for concurrency tests); it may be nil.
func New(t testing.TB, configure func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	return Pool(t, URL(t), configure)
}

// Pool opens a pool on url that is closed when t ends.
func Pool(t testing.TB, url string, configure func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatalf("pgtest: parse pool config: %v", err)
	}
	pgarray.Configure(cfg) // as every pool of cmd/tokengate
	if configure != nil {
		configure(cfg)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("pgtest: pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Admin returns a superuser pool on the server's maintenance database, for
// tests that must act outside a test database (killing connections, say).
func Admin(t testing.TB) *pgxpool.Pool {
	t.Helper()
	ensureStarted(t)
	return admin
}

func newDatabase(t testing.TB, fromTemplate bool) string {
	t.Helper()
	ensureStarted(t)
	from := ""
	if fromTemplate {
		from = template
	}
	name := "t_" + strings.ToLower(sanitizeName(t.Name())) + "_" + randomSuffix()
	stmt := "CREATE DATABASE " + pgx.Identifier{name}.Sanitize()
	if from != "" {
		stmt += " TEMPLATE " + pgx.Identifier{from}.Sanitize()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	createMu.Lock()
	_, err := admin.Exec(ctx, stmt)
	createMu.Unlock()
	if err != nil {
		t.Fatalf("pgtest: %s: %v", stmt, err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("pgtest: kept database %s for inspection", name)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Errorf("pgtest: drop %s: %v", name, err)
		}
	})
	return urlFor(name)
}

// sanitizeName keeps a database name short and readable: Postgres truncates
// identifiers at 63 bytes.
func sanitizeName(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
		if b.Len() >= 40 {
			break
		}
	}
	return b.String()
}
