package api

import (
	"errors"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"
)

// The timeouts of every HTTP server of a replica (API and dashboard, proxy,
// profiler), named once. None bounds writing: the proxy relays streams
// that run for minutes, and a waiting admission (max_wait_ms) answers late.
const (
	// DefaultReadHeaderTimeout bounds reading a request's headers.
	DefaultReadHeaderTimeout = 10 * time.Second
	// DefaultBodyReadTimeout bounds reading a request's body, from the end
	// of its headers: a body that has not arrived by then answers 408 and
	// its connection is closed.
	DefaultBodyReadTimeout = 30 * time.Second
	// DefaultIdleTimeout bounds a keep-alive connection between requests.
	DefaultIdleTimeout = 2 * time.Minute
	// DefaultDrainTimeout bounds how long the rest of a body a handler did
	// not read (a 401 answered before it) is read and discarded so that
	// the connection can serve another request. A body that takes longer,
	// or is larger than DrainBytes, closes the connection instead.
	DefaultDrainTimeout = 2 * time.Second
	// DrainBytes is the most of an unread body that is discarded to keep
	// a connection open.
	DrainBytes = 256 << 10
)

// HTTPTimeouts are the timeouts an HTTP server applies. Zero fields take
// the Default values.
type HTTPTimeouts struct {
	ReadHeader time.Duration
	BodyRead   time.Duration
	Idle       time.Duration
	Drain      time.Duration
}

func (t HTTPTimeouts) withDefaults() HTTPTimeouts {
	if t.ReadHeader <= 0 {
		t.ReadHeader = DefaultReadHeaderTimeout
	}
	if t.BodyRead <= 0 {
		t.BodyRead = DefaultBodyReadTimeout
	}
	if t.Idle <= 0 {
		t.Idle = DefaultIdleTimeout
	}
	if t.Drain <= 0 {
		t.Drain = DefaultDrainTimeout
	}
	return t
}

// Apply sets hs's timeouts and wraps its handler (set it first) with the
// body read deadline. It sets no ReadTimeout or WriteTimeout: those bound
// the whole exchange, streams included.
func (t HTTPTimeouts) Apply(hs *http.Server) {
	t = t.withDefaults()
	hs.ReadHeaderTimeout = t.ReadHeader
	hs.IdleTimeout = t.Idle
	hs.ReadTimeout, hs.WriteTimeout = 0, 0
	hs.Handler = t.Handler(hs.Handler)
}

// Handler wraps h so that each request's body must arrive within BodyRead
// of its headers. Reading a late body fails with an error matching
// os.ErrDeadlineExceeded (IsBodyTimeout), which the faces answer with 408,
// and the connection is closed after the answer. The deadline is lifted
// once the body has been read to its end, so that a long answer (a stream,
// a wait) is not cut. A body the handler leaves unread is discarded, for
// at most Drain and DrainBytes, when the answer starts; past that the
// connection is closed. Writers that cannot set deadlines (tests'
// recorders) are served as they are.
func (t HTTPTimeouts) Handler(h http.Handler) http.Handler {
	t = t.withDefaults()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
			h.ServeHTTP(w, r)
			return
		}
		rc := http.NewResponseController(w)
		deadline := time.Now().Add(t.BodyRead)
		if err := rc.SetReadDeadline(deadline); err != nil {
			h.ServeHTTP(w, r)
			return
		}
		b := &deadlineBody{ReadCloser: r.Body, rc: rc, hdr: w.Header(), deadline: deadline, drain: t.Drain,
			expect: strings.EqualFold(r.Header.Get("Expect"), "100-continue")}
		r.Body = b
		dw := &drainWriter{ResponseWriter: w, body: b}
		h.ServeHTTP(dw, r)
		b.drainOnce()
	})
}

// IsBodyTimeout reports whether err is a request body read that passed its
// deadline (see HTTPTimeouts.Handler).
func IsBodyTimeout(err error) bool { return errors.Is(err, os.ErrDeadlineExceeded) }

// deadlineBody is a request body read under the connection's deadline.
type deadlineBody struct {
	io.ReadCloser
	rc       *http.ResponseController
	hdr      http.Header
	deadline time.Time
	drain    time.Duration

	// expect: the client waits for "100 Continue" before sending the
	// body; if the handler never read it, reading it now would ask for it.
	expect bool

	mu       sync.Mutex
	read     bool
	eof      bool
	failed   bool
	drainRun bool
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.mu.Lock()
	b.read = true
	b.mu.Unlock()
	switch {
	case err == io.EOF:
		b.mu.Lock()
		if !b.eof {
			b.eof = true
			// The whole body is in: the deadline is lifted (net/http does
			// too as it starts watching for the client going away), so a
			// long answer is never cut.
			_ = b.rc.SetReadDeadline(time.Time{})
		}
		b.mu.Unlock()
	case err != nil:
		b.mu.Lock()
		if !b.failed {
			b.failed = true
			// What remains on the wire must never be read as a request.
			b.hdr.Set("Connection", "close")
		}
		b.mu.Unlock()
	}
	return n, err
}

// drainOnce discards what the handler left of the body, once, before the
// answer's headers go out: within the drain timeout it keeps the
// connection, past it (or past DrainBytes) it closes it.
func (b *deadlineBody) drainOnce() {
	b.mu.Lock()
	if b.drainRun || b.eof || b.failed {
		b.drainRun = true
		b.mu.Unlock()
		return
	}
	b.drainRun = true
	unasked := b.expect && !b.read
	b.mu.Unlock()
	if unasked {
		// Never asked for: the client has not sent it, and the connection
		// closes after the answer instead (as net/http does).
		b.hdr.Set("Connection", "close")
		return
	}
	until := time.Now().Add(b.drain)
	if b.deadline.Before(until) {
		until = b.deadline
	}
	_ = b.rc.SetReadDeadline(until)
	if _, err := io.CopyN(io.Discard, b, DrainBytes+1); err == io.EOF {
		return
	}
	b.mu.Lock()
	b.failed = true
	b.mu.Unlock()
	b.hdr.Set("Connection", "close")
}

// drainWriter drains the request body's rest before the answer starts.
type drainWriter struct {
	http.ResponseWriter
	body *deadlineBody
}

func (w *drainWriter) WriteHeader(code int) {
	if code >= 200 {
		w.body.drainOnce()
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *drainWriter) Write(p []byte) (int, error) {
	w.body.drainOnce()
	return w.ResponseWriter.Write(p)
}

// Flush lets streams through the wrapper.
func (w *drainWriter) Flush() {
	w.body.drainOnce()
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

// Unwrap lets http.ResponseController reach the connection.
func (w *drainWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
