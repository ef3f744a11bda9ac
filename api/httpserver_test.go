package api_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/tokengate/tokengate/api"
)

// TestBodyDeadlineDoesNotCutLongAnswers: once the body is in, the body
// read deadline is lifted: an answer streamed for longer than it (a proxy
// stream, a waiting admission) is neither cut nor has its context
// cancelled, and the connection serves the next request.
func TestBodyDeadlineDoesNotCutLongAnswers(t *testing.T) {
	t.Parallel()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.ReadAll(r.Body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		_, _ = io.WriteString(w, "first\n")
		_ = http.NewResponseController(w).Flush()
		select {
		case <-time.After(600 * time.Millisecond): // three body deadlines
		case <-r.Context().Done():
			return
		}
		_, _ = io.WriteString(w, "second\n")
	}))
	api.HTTPTimeouts{BodyRead: 200 * time.Millisecond, Drain: 100 * time.Millisecond}.Apply(srv.Config)
	srv.Start()
	t.Cleanup(srv.Close)

	client := srv.Client()
	for i := range 2 { // the second request reuses the connection
		resp, err := client.Post(srv.URL, "text/plain", strings.NewReader("body"))
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || string(raw) != "first\nsecond\n" {
			t.Fatalf("request %d: %d %q, want the whole answer", i, resp.StatusCode, raw)
		}
	}
}

// TestUnreadBodyIsDrainedOrClosed: a body the handler did not read is
// discarded when it is all there (the connection is kept), and the
// connection is closed when the rest does not come within the drain time.
func TestUnreadBodyIsDrainedOrClosed(t *testing.T) {
	t.Parallel()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusUnauthorized)
	}))
	api.HTTPTimeouts{BodyRead: 5 * time.Second, Drain: 200 * time.Millisecond}.Apply(srv.Config)
	srv.Start()
	t.Cleanup(srv.Close)

	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(conn)
	// Whole: answered, and the connection stays for the next request.
	_, _ = io.WriteString(conn, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nbody")
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusUnauthorized || resp.Close {
		t.Fatalf("whole body: %v %v, want 401 on a kept connection", resp, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	// Partial: answered at the drain time, and the connection closed.
	start := time.Now()
	_, _ = io.WriteString(conn, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nbo")
	resp, err = http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusUnauthorized || !resp.Close {
		t.Fatalf("partial body: %v %v, want 401 and the connection closed", resp, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	if _, err := br.ReadByte(); err == nil {
		t.Fatal("the connection carried more after the answer")
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("held %s with a 200 ms drain", d)
	}
}
