package estimator_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tokengate/tokengate/estimator"
)

// TestGateSharesAndRefuses: a tenant holds at most its share of the gate,
// the gate at most its bytes; a caller past either waits, and is refused
// with ErrBusy once the gate's wait runs out, or served as soon as bytes
// are given back; a body larger than the gate runs alone.
func TestGateSharesAndRefuses(t *testing.T) {
	const wait = 100 * time.Millisecond // real time is the subject: the wait
	g := estimator.NewGate(estimator.GateConfig{Bytes: 1000, TenantBytes: 400, Wait: wait})
	ctx := context.Background()
	relA, err := g.Acquire(ctx, "a", 300)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.Acquire(ctx, "a", 101); !errors.Is(err, estimator.ErrBusy) {
		t.Fatalf("a past its share: %v; want ErrBusy", err)
	}
	relB, err := g.Acquire(ctx, "b", 400)
	if err != nil {
		t.Fatalf("b while a holds its share: %v", err)
	}
	relC, err := g.Acquire(ctx, "c", 300)
	if err != nil {
		t.Fatalf("c: %v", err)
	}
	if s := g.Stats(); s.InUse != 1000 || s.Refusals != 1 || s.Waits != 1 {
		t.Fatalf("stats %+v; want 1000 in use, one wait refused", s)
	}
	if _, err := g.Acquire(ctx, "d", 1); !errors.Is(err, estimator.ErrBusy) {
		t.Fatalf("d with the gate full: %v; want ErrBusy", err)
	}
	// A waiter is served once bytes are given back.
	got := make(chan error, 1)
	go func() {
		rel, err := g.Acquire(ctx, "d", 300)
		if err == nil {
			rel()
		}
		got <- err
	}()
	relB()
	if err := <-got; err != nil {
		t.Fatalf("d after b gave its bytes back: %v", err)
	}
	relA()
	relA() // twice is once
	relC()
	if s := g.Stats(); s.InUse != 0 {
		t.Fatalf("stats %+v; want nothing in use", s)
	}
	relBig, err := g.Acquire(ctx, "a", 5000)
	if err != nil {
		t.Fatalf("a body larger than the gate, alone: %v", err)
	}
	if s := g.Stats(); s.InUse != 1000 {
		t.Fatalf("stats %+v; want the whole gate in use", s)
	}
	relBig()
	// The caller's own end is its own error, not a refusal.
	relAll, _ := g.Acquire(ctx, "x", 400)
	defer relAll()
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := g.Acquire(cctx, "x", 1); !errors.Is(err, context.Canceled) {
		t.Fatalf("with the caller gone: %v; want context.Canceled", err)
	}
	var nilGate *estimator.Gate
	if rel, err := nilGate.Acquire(ctx, "a", 1<<40); err != nil {
		t.Fatal(err)
	} else {
		rel()
	}
}
