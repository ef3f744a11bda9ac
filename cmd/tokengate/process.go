// process.go: the replica process's settings that are no face's and no
// service's: trusted proxies, the collector's pace, the profiler, the
// periodic work loop.

package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"time"

	"github.com/tokengate/tokengate/api"
)

// parseCIDRs parses CIDR ranges; a bare address is a range of one.
func parseCIDRs(list []string) ([]*net.IPNet, error) {
	var out []*net.IPNet
	for _, item := range list {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		if !strings.Contains(item, "/") {
			ip := net.ParseIP(item)
			if ip == nil {
				return nil, fmt.Errorf("%q is not an address or a CIDR range", item)
			}
			bits := 128
			if ip.To4() != nil {
				ip, bits = ip.To4(), 32
			}
			out = append(out, &net.IPNet{IP: ip, Mask: net.CIDRMask(bits, bits)})
			continue
		}
		_, n, err := net.ParseCIDR(item)
		if err != nil {
			return nil, fmt.Errorf("%q is not an address or a CIDR range", item)
		}
		out = append(out, n)
	}
	return out, nil
}

// tuneGC sets the collector's pace unless the environment already did
// (GOGC, GOMEMLIMIT). A decision allocates what it sends and receives and
// keeps almost nothing, so Go's default (a collection each time the heap
// doubles) collects hundreds of times a second under load, a fifth of the
// replica's CPU in profiles. Collecting at 5x the live heap cuts that to a
// quarter; the soft memory limit then keeps the replica's peak near its
// baseline plus limit, collecting earlier only once the heap nears it.
//
// The limit is over the baseline, the heap live at start (the estimator's
// tables, loaded first: about 45 MB for both encodings), not over zero: a
// 64 MiB limit over the whole heap left some 20 MB for the requests' work,
// the collector ran every few hundred admissions, and one replica's CPU
// per admission went from 250 to 1088 us (BENCHMARKS.md, issue 36).
func tuneGC(percent int, limit int64) {
	if os.Getenv("GOGC") == "" && percent != 0 {
		debug.SetGCPercent(percent)
	}
	if os.Getenv("GOMEMLIMIT") == "" && limit > 0 {
		debug.SetMemoryLimit(limit + baseline())
	}
}

// baseline is the heap live right now, after a collection: what the
// replica holds whatever its load.
func baseline() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// serveProfiler serves net/http/pprof on addr, on a listener and mux of its
// own (never the API's), and returns how to stop it.
func serveProfiler(addr string, logger *slog.Logger) (func(), error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--pprof-addr %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	hs := &http.Server{Handler: mux}
	api.HTTPTimeouts{}.Apply(hs)
	go func() { _ = hs.Serve(ln) }()
	logger.Warn("serving the profiler", "address", ln.Addr().String())
	return func() { _ = hs.Close() }, nil
}

// every runs fn every d until ctx ends. An error is logged and the next
// tick tries again: background work of a replica never stops it.
func every(ctx context.Context, d time.Duration, logger *slog.Logger, what string, fn func(context.Context) error) {
	if d <= 0 {
		logger.Warn(what+" is off: its interval is not positive", "interval", d.String())
		return
	}
	ticker := time.NewTicker(d)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		if err := fn(ctx); err != nil && ctx.Err() == nil {
			logger.Warn(what+" failed", "error", err.Error())
		}
	}
}

func displayURL(addr net.Addr) string {
	tcp, ok := addr.(*net.TCPAddr)
	if !ok || tcp.IP.IsUnspecified() {
		port := 0
		if ok {
			port = tcp.Port
		}
		return fmt.Sprintf("http://localhost:%d", port)
	}
	return "http://" + tcp.String()
}
