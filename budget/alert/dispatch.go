package alert

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

var (
	//go:embed sql/event_claim.sql
	eventClaimSQL string
	//go:embed sql/event_finish.sql
	eventFinishSQL string
)

// Dispatcher delivers the outbox. Every replica runs one: each leases due
// events with SKIP LOCKED, so they share the work without waiting for each
// other, and an event leased by a replica that dies is taken over when its
// lease runs out.
type Dispatcher struct {
	Store   *Store
	Replica string
	// Client sends the webhooks (default: a 10 s timeout). Its timeout must
	// be well under Lease, or a slow receiver gets a second delivery while
	// the first is still in flight. The dispatcher never lets it follow a
	// redirect, and unless Store.AllowPrivate it sends through a copy of
	// its *http.Transport (no proxy) whose every connection is checked
	// against the address policy; another RoundTripper is then refused.
	Client *http.Client
	// Lease is how long a replica owns an event it is delivering (default
	// 30 s).
	Lease time.Duration
	// Backoff after the n-th failed attempt: Base × 2^(n-1), at most Max,
	// drawn at random from its upper half (jitter, so that receivers
	// coming back are not hit by every event at once). Retries stop once
	// an event is GiveUpAfter old: it is recorded failed (an admin may
	// redeliver it). Defaults: 1 s, 10 min, 24 h.
	Base, Max, GiveUpAfter time.Duration
	// Batch is how many events one round leases (default 20); they are
	// delivered concurrently.
	Batch  int
	Logger *slog.Logger
	// NowFunc stamps the signatures; tests move it. Default time.Now.
	NowFunc func() time.Time

	mu sync.Mutex
	// guarded is guardedFrom's copy that checks every address it connects
	// to (built once per transport, so connections are reused).
	guarded, guardedFrom *http.Transport
}

func (d *Dispatcher) now() time.Time {
	if d.NowFunc != nil {
		return d.NowFunc()
	}
	return time.Now()
}

func orDefault[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// backoff is the wait after the attempt-th failure.
func (d *Dispatcher) backoff(attempt int) time.Duration {
	base, most := orDefault(d.Base, time.Second), orDefault(d.Max, 10*time.Minute)
	wait := base
	for i := 1; i < attempt && wait < most; i++ {
		wait *= 2
	}
	wait = min(wait, most)
	return wait/2 + rand.N(wait/2+1)
}

type leased struct {
	id, typ     string
	payload     json.RawMessage
	attempt     int
	createdAt   time.Time
	endpointID  string
	url         string
	salt        []byte
	endpointOff bool
}

// Body is what a delivery posts: the same bytes on every attempt, so a
// receiver may deduplicate by ID (also in the Tokengate-Event-Id header).
type Body struct {
	ID        string          `json:"id"`
	Type      string          `json:"type"`
	CreatedAt time.Time       `json:"created_at"`
	Data      json.RawMessage `json:"data"`
}

// Once leases due events and delivers them; it returns how many it
// recorded delivered.
func (d *Dispatcher) Once(ctx context.Context) (int, error) {
	if len(d.Store.key) == 0 {
		return 0, ErrNoKey
	}
	lease := orDefault(d.Lease, 30*time.Second)
	rows, _ := d.Store.pool.Query(ctx, eventClaimSQL, d.Replica, orDefault(d.Batch, 20), lease.Milliseconds())
	events, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (leased, error) {
		var l leased
		err := r.Scan(&l.id, &l.typ, &l.payload, &l.attempt, &l.createdAt, &l.endpointID, &l.url, &l.salt, &l.endpointOff)
		return l, err
	})
	if err != nil {
		return 0, fmt.Errorf("alert: lease events: %w", err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	delivered, firstErr := 0, error(nil)
	for _, ev := range events {
		wg.Go(func() {
			ok, err := d.deliver(ctx, ev)
			mu.Lock()
			defer mu.Unlock()
			if ok {
				delivered++
			}
			if err != nil && firstErr == nil {
				firstErr = err
			}
		})
	}
	wg.Wait()
	return delivered, firstErr
}

// deliver makes one attempt and records it.
func (d *Dispatcher) deliver(ctx context.Context, ev leased) (bool, error) {
	body, _ := json.Marshal(Body{ID: ev.id, Type: ev.typ, CreatedAt: ev.createdAt.UTC(), Data: ev.payload})
	start := time.Now()
	var status *int
	var problem *string
	ok := false
	if ev.endpointOff {
		s := "endpoint disabled"
		problem = &s
	} else {
		code, location, err := d.post(ctx, ev, body)
		switch {
		case err != nil:
			s := storableText(err.Error(), 1000)
			problem = &s
		default:
			status = &code
			ok = code >= 200 && code < 300
			switch {
			case code >= 300 && code < 400:
				s := "answered " + strconv.Itoa(code) + " to " + orDash(storableText(location, 500)) +
					": redirects are not followed (update the endpoint's URL instead)"
				problem = &s
			case !ok:
				s := "answered " + strconv.Itoa(code)
				problem = &s
			}
		}
	}
	giveUp := ev.endpointOff || (!ok && time.Since(ev.createdAt) >= orDefault(d.GiveUpAfter, 24*time.Hour))
	wait := d.backoff(ev.attempt)
	took := int32(min(time.Since(start).Milliseconds(), 1<<31-1))
	// Recorded even if ctx ends now: the attempt happened.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	var outcome string
	err := d.Store.pool.QueryRow(rctx, eventFinishSQL, ev.id, d.Replica, ev.attempt, ok, status, wait.Milliseconds(), giveUp, problem, took).Scan(&outcome)
	if err != nil {
		return false, fmt.Errorf("alert: record attempt %d of %s: %w", ev.attempt, ev.id, err)
	}
	if d.Logger != nil && outcome != "delivered" {
		d.Logger.Warn("alert delivery not completed", "event", ev.id, "attempt", ev.attempt, "outcome", outcome,
			"problem", deref(problem), "retry_in", wait.String(), "given_up", giveUp)
	}
	return outcome == "delivered", nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// client is d.Client as deliveries use it: it never follows a redirect,
// and unless private addresses are allowed, every address it connects to
// is checked (see Policy).
func (d *Dispatcher) client() (*http.Client, error) {
	c := &http.Client{Timeout: 10 * time.Second}
	if d.Client != nil {
		*c = *d.Client
	}
	c.CheckRedirect, c.Jar = noRedirect, nil
	if d.Store.AllowPrivate {
		return c, nil
	}
	var from *http.Transport
	switch t := c.Transport.(type) {
	case nil:
		from = baseTransport
	case *http.Transport:
		from = t
	default:
		return nil, fmt.Errorf("%w: the dispatcher's client must use an *http.Transport to check the addresses it connects to", ErrAddressRefused)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.guardedFrom != from {
		if d.guarded != nil {
			d.guarded.CloseIdleConnections()
		}
		d.guarded, d.guardedFrom = guard(from), from
	}
	c.Transport = d.guarded
	return c, nil
}

// post sends the signed body; it reports the status (with the Location of
// a redirect, which is not followed) or why nothing was sent or answered.
func (d *Dispatcher) post(ctx context.Context, ev leased, body []byte) (int, string, error) {
	u, err := url.Parse(ev.url)
	if err != nil {
		return 0, "", errors.New("the endpoint's URL does not parse")
	}
	// The scheme is this replica's to allow, whatever the replica that
	// created the endpoint allowed.
	if err := d.Store.checkScheme(u); err != nil {
		return 0, "", fmt.Errorf("not sent: %s:// endpoint, and this replica runs without --alert-allow-http", u.Scheme)
	}
	client, err := d.client()
	if err != nil {
		return 0, "", err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, ev.url, bytes.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	now := d.now()
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "tokengate-alerts/1")
	req.Header.Set(HeaderEventID, ev.id)
	req.Header.Set(HeaderEventType, ev.typ)
	req.Header.Set("Tokengate-Attempt", strconv.Itoa(ev.attempt))
	req.Header.Set(HeaderTimestamp, strconv.FormatInt(now.Unix(), 10))
	req.Header.Set(HeaderSignature, Sign(deriveSecret(d.Store.key, ev.endpointID, ev.salt), now, body))
	resp, err := client.Do(req)
	if err != nil {
		var uerr interface{ Timeout() bool }
		var refused *addressError
		switch {
		case errors.As(err, &refused):
			return 0, "", refused
		case errors.As(err, &uerr) && uerr.Timeout():
			return 0, "", fmt.Errorf("no answer within the timeout")
		}
		return 0, "", errors.Unwrap(err) // the url is in the event already
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	return resp.StatusCode, resp.Header.Get("Location"), nil
}

// Run delivers until ctx ends, every interval (and at once again after a
// full batch, which means more are due).
func (d *Dispatcher) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		n, err := d.Once(ctx)
		if err != nil && ctx.Err() == nil && d.Logger != nil {
			d.Logger.Error("alert dispatcher", "error", err.Error())
		}
		if n >= orDefault(d.Batch, 20) {
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
