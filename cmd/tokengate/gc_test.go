package main

import (
	"os"
	"runtime/debug"
	"testing"

	"github.com/tokengate/tokengate/estimator"
)

// TestMemoryLimitIsOverTheBaseline: the soft memory limit is the flag's
// value over what the replica holds at start, the estimator's tables. Set
// over zero, 64 MiB left some 20 MB for the requests' work once both
// tables were live, and the collector's constant runs quadrupled one
// replica's CPU per admission (BENCHMARKS.md, issue 36).
func TestMemoryLimitIsOverTheBaseline(t *testing.T) {
	if os.Getenv("GOMEMLIMIT") != "" || os.Getenv("GOGC") != "" {
		t.Fatal("GOMEMLIMIT or GOGC is set in the test's environment: tuneGC would leave both alone")
	}
	if err := estimator.Load(); err != nil {
		t.Fatal(err)
	}
	prevLimit := debug.SetMemoryLimit(-1)
	prevPercent := debug.SetGCPercent(100)
	t.Cleanup(func() {
		debug.SetMemoryLimit(prevLimit)
		debug.SetGCPercent(prevPercent)
	})

	const work = 64 << 20
	tuneGC(400, work)
	got := debug.SetMemoryLimit(-1)
	// Both encodings' tables are over 25 MiB live; the rest of the test
	// binary's heap only adds to the baseline.
	if over := got - work; over < 25<<20 {
		t.Fatalf("memory limit %d is only %d bytes over the flag's %d: the tables' baseline is not counted", got, over, work)
	}
	if p := debug.SetGCPercent(100); p != 400 {
		t.Fatalf("GC percent %d, want 400", p)
	}
}
