// Package memtest measures how far a test's work moves the process's memory:
// the heap (runtime.MemStats.HeapInuse) and the resident set
// (/proc/self/status), sampled while the work runs. The hostile-body tests
// of the API and the proxy wires assert their bounds with it, so that what
// one tenant key can make a replica hold is a checked number, not a guess.
package memtest

import (
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Peak samples the heap and the resident set every 5 ms from Start to End,
// keeping the highest of each above where they started.
type Peak struct {
	stop, done        chan struct{}
	heap0, rss0       uint64
	heapPeak, rssPeak uint64
	hwmReset          bool
}

// Start collects garbage, returns memory to the OS (so the start is a low
// mark) and begins sampling.
func Start(t testing.TB) *Peak {
	t.Helper()
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	m := &Peak{stop: make(chan struct{}), done: make(chan struct{}), heap0: ms.HeapInuse, rss0: procStatus(t, "VmRSS")}
	m.heapPeak, m.rssPeak = m.heap0, m.rss0
	// "5" resets the peak resident set (VmHWM) to the current one, so that
	// VmHWM catches a peak between two samples.
	m.hwmReset = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) == nil
	go func() {
		defer close(m.done)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			m.heapPeak = max(m.heapPeak, ms.HeapInuse)
			m.rssPeak = max(m.rssPeak, procStatus(t, "VmRSS"))
			select {
			case <-m.stop:
				return
			case <-tick.C:
			}
		}
	}()
	return m
}

// End stops sampling and returns the peak growth of the heap and of the
// resident set, in bytes.
func (m *Peak) End(t testing.TB) (heap, rss uint64) {
	t.Helper()
	close(m.stop)
	<-m.done
	if m.hwmReset {
		m.rssPeak = max(m.rssPeak, procStatus(t, "VmHWM"))
	}
	return m.heapPeak - min(m.heapPeak, m.heap0), m.rssPeak - min(m.rssPeak, m.rss0)
}

// procStatus reads a "kB" line of /proc/self/status, in bytes.
func procStatus(t testing.TB, field string) uint64 {
	raw, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Error(err)
		return 0
	}
	for line := range strings.SplitSeq(string(raw), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				t.Error(err)
			}
			return kb << 10
		}
	}
	t.Errorf("no %s in /proc/self/status", field)
	return 0
}
