package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tokengate/tokengate/estimator"
	"github.com/tokengate/tokengate/integration/await"
	"github.com/tokengate/tokengate/integration/pgtest"
)

// TestMain runs the tests, or, with TOKENGATE_TEST_AS_MAIN=1, runs this
// binary as tokengate itself, for tests that run the CLI as a user does
// (the README's round trip).
func TestMain(m *testing.M) {
	if os.Getenv(asMain) == "1" {
		main()
		os.Exit(0)
	}
	// serve builds the estimator's tables before it answers (seconds under
	// the race detector): built once here, no test's readiness wait pays it.
	if err := estimator.Load(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	pgtest.Main(m)
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// startServe runs the command args until the test ends, once each of the
// URLs answers below 500, and returns how to stop it earlier (its error
// is checked either way).
func startServe(t *testing.T, args []string, urls ...string) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, args, io.Discard, io.Discard) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("serve after shutdown: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	deadline := time.Now().Add(30 * time.Second)
	for _, u := range urls {
		for {
			resp, err := http.Get(u)
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode < 500 {
					break
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s never answered (last: %v)", u, err)
			}
			select {
			case err := <-done:
				done <- err
				t.Fatalf("serve returned early: %v", err)
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return stop
}

func TestServeRefusesPendingMigrations(t *testing.T) {
	t.Parallel()
	err := run(context.Background(), []string{"serve", "--database-url", pgtest.EmptyURL(t), "--addr", freeAddr(t), "--log-level", "error"}, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "tokengate migrate") {
		t.Fatalf("serve on an unmigrated database = %v, want a refusal naming `tokengate migrate`", err)
	}
}

func TestServeWithMigrateBecomesReady(t *testing.T) {
	t.Parallel()
	g := &globals{DatabaseURL: pgtest.EmptyURL(t), LogLevel: "error", Wait: 5 * time.Second, stdout: io.Discard, stderr: io.Discard}
	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serveCmd{Addr: addr, Migrate: true, MaxConns: 4}.Run(ctx, g) }()

	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve --migrate never became ready (last: %v)", err)
		}
		select {
		case err := <-done:
			t.Fatalf("serve returned early: %v", err)
		case <-time.After(50 * time.Millisecond):
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve after shutdown: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("serve did not return after its context ended")
	}

	// A plain `migrate` afterwards has nothing left to do, and serve without
	// --migrate now starts.
	if err := run(context.Background(), []string{"migrate", "--database-url", g.DatabaseURL, "--log-level", "error"}, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
}

// Not parallel: it sets the environment, as an operator would.
func TestDatabaseUnreachableFailsAfterWait(t *testing.T) {
	g := &globals{stdout: io.Discard, stderr: io.Discard, DatabaseURL: "postgres://x:y@" + freeAddr(t) + "/z?connect_timeout=1", LogLevel: "error", Wait: time.Second}
	start := time.Now()
	t.Setenv("TOKENGATE_DATABASE_URL", g.DatabaseURL) // the variable every command reads
	err := run(context.Background(), []string{"migrate", "--wait", "1s"}, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "not reachable") {
		t.Fatalf("migrate against nothing = %v", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("gave up after %s, want about the 1 s wait", took)
	}
}

// TestServeWithTheProxy: --proxy-addr without --upstream is refused at
// start; with it, the proxy answers on its address (an unknown key gets
// OpenAI's 401 shape, so SDKs report it as an authentication error; on
// /v1/messages, with --anthropic-upstream, Anthropic's authentication_error;
// on a Gemini route, with --gemini-upstream, Google's UNAUTHENTICATED).
func TestServeWithTheProxy(t *testing.T) {
	t.Parallel()
	url := pgtest.EmptyURL(t)
	err := run(context.Background(), []string{"serve", "--database-url", url, "--migrate", "--addr", freeAddr(t), "--proxy-addr", freeAddr(t), "--log-level", "error"}, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "--upstream") {
		t.Fatalf("serve --proxy-addr without --upstream = %v, want a refusal naming --upstream", err)
	}
	err = run(context.Background(), []string{"proxy", "--database-url", url, "--addr", freeAddr(t), "--log-level", "error"}, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "--upstream") {
		t.Fatalf("proxy without --upstream = %v, want a refusal naming --upstream", err)
	}
	g := &globals{DatabaseURL: url, LogLevel: "error", Wait: 5 * time.Second, stdout: io.Discard, stderr: io.Discard}
	proxyAddr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- proxyCmd{serveCmd{Addr: freeAddr(t), Migrate: true, MaxConns: 4, ProxyAddr: proxyAddr, Upstream: "http://127.0.0.1:1",
			AnthropicUpstream: "http://127.0.0.1:1", GeminiUpstream: "http://127.0.0.1:1", ShutdownTimeout: 5 * time.Second}}.Run(ctx, g)
	}()
	deadline := time.Now().Add(20 * time.Second)
	for {
		req, _ := http.NewRequest(http.MethodPost, "http://"+proxyAddr+"/v1/chat/completions", strings.NewReader(`{}`))
		req.Header.Set("Authorization", "Bearer tg_nosuchkey_0000")
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(string(body), `"error"`) {
				t.Fatalf("proxy answered %d %s, want 401 with an OpenAI error", resp.StatusCode, body)
			}
			req, _ := http.NewRequest(http.MethodPost, "http://"+proxyAddr+"/v1/messages", strings.NewReader(`{}`))
			req.Header.Set("X-Api-Key", "tg_nosuchkey_0000")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(string(body), `"type":"authentication_error"`) {
				t.Fatalf("/v1/messages answered %d %s, want 401 authentication_error", resp.StatusCode, body)
			}
			resp, err = http.Post("http://"+proxyAddr+"/v1beta/models/gemini-2.5-flash:generateContent?key=tg_nosuchkey_0000", "application/json", strings.NewReader(`{}`))
			if err != nil {
				t.Fatal(err)
			}
			body, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(string(body), `"status":"UNAUTHENTICATED"`) {
				t.Fatalf(":generateContent answered %d %s, want Google's 401 UNAUTHENTICATED", resp.StatusCode, body)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the proxy never answered (last: %v)", err)
		}
		select {
		case err := <-done:
			t.Fatalf("serve returned early: %v", err)
		case <-time.After(50 * time.Millisecond):
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("serve after shutdown: %v", err)
	}
}

// TestServeWithAMultiHostURLAndAReadURL: serve takes a multi-host URL
// whose first host is down (a failed primary) and connects to the next
// one, and --read-database-url gives it a reads pool whose lag it measures
// and exports (0, from a node that is not a standby).
func TestServeWithAMultiHostURLAndAReadURL(t *testing.T) {
	t.Parallel()
	good := pgtest.URL(t)
	u, err := url.Parse(good)
	if err != nil {
		t.Fatal(err)
	}
	multi := *u
	multi.Host = freeAddr(t) + "," + u.Host // nothing listens on the first
	addr := freeAddr(t)
	startServe(t, []string{"serve", "--database-url", multi.String(), "--read-database-url", good, "--addr", addr, "--log-level", "error"},
		"http://"+addr+"/readyz")
	var body []byte
	await.UntilEvery(t, 15*time.Second, 200*time.Millisecond, "/metrics to show the reads pool's lag", func() bool {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		return strings.Contains(string(body), "tokengate_read_replica_up 1\n") && strings.Contains(string(body), "tokengate_read_replica_standby 0\n") &&
			strings.Contains(string(body), "tokengate_read_replica_lag_seconds 0\n")
	}, func() string { return "\n" + grepLines(string(body), "tokengate_read_replica") })
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
