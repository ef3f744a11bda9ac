package api_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/budget/replica"
	"github.com/tokengate/tokengate/integration/pgtest"
)

// TestPoolExhaustedAnswers503ThenLeaksNothing: with every database
// connection taken, an admission waits up to the store timeout and gets 503
// store_busy, the server stays healthy, and once it shuts down no goroutine
// of it is left behind. Not parallel: goleak looks at the whole process.
func TestPoolExhaustedAnswers503ThenLeaksNothing(t *testing.T) {
	before := goleak.IgnoreCurrent()
	dbURL := pgtest.URL(t)
	setupPool := pgtest.Pool(t, dbURL, nil)
	store := account.NewStore(setupPool)
	if _, err := store.CreateTenant(ctx, account.CreateTenantParams{ID: "acme", Limits: lim(1000, "1")}); err != nil {
		t.Fatal(err)
	}
	_, key, err := credential.KeyCreate(ctx, setupPool, "acme")
	if err != nil {
		t.Fatal(err)
	}

	func() {
		cfg, err := pgxpool.ParseConfig(dbURL)
		if err != nil {
			t.Fatal(err)
		}
		cfg.MaxConns = 2
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		srv, rep := newServer(t, &testConfig{replicaConfig: replica.Config{DB: pool, StoreTimeout: 400 * time.Millisecond}})
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		sctx, stop := context.WithCancel(ctx)
		served := make(chan error, 1)
		go func() { served <- srv.Serve(sctx, ln) }()
		url := "http://" + ln.Addr().String()
		client := &http.Client{Transport: &http.Transport{}}
		defer client.CloseIdleConnections()
		post := func() (int, string) {
			req, _ := http.NewRequest(http.MethodPost, url+"/v1/admissions", strings.NewReader(chat(10, "x")))
			req.Header.Set("Authorization", "Bearer "+key)
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(body)
		}
		if code, body := post(); code != http.StatusCreated { // also caches the key for later
			t.Fatalf("warm-up: %d %s", code, body)
		}
		// Take every connection of the replica's pool.
		var held []*pgxpool.Conn
		for range 2 {
			conn, err := pool.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, conn)
		}
		start := time.Now()
		code, body := post()
		took := time.Since(start)
		if code != http.StatusServiceUnavailable || !strings.Contains(body, "store_busy") {
			t.Fatalf("with the pool exhausted: %d %s", code, body)
		}
		if took < 350*time.Millisecond || took > 3*time.Second {
			t.Fatalf("answered after %s, want about the 400 ms store timeout", took)
		}
		for _, c := range held {
			c.Release()
		}
		if code, body := post(); code != http.StatusCreated {
			t.Fatalf("after the pool freed: %d %s (a busy pool must not trip the outage breaker)", code, body)
		}
		stop()
		if err := <-served; err != nil {
			t.Fatal(err)
		}
		if err := srv.Close(); err != nil {
			t.Fatal(err)
		}
		rep.Close() // the replica is its builder's (cmd's) to close
	}()
	goleak.VerifyNone(t, before,
		// The pgtest pools (closed at cleanup) and net/http's keep-alive
		// machinery are not the server's.
		goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
	)
}
