package rule

import (
	"archive/zip"
	"bytes"
	_ "embed"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// zoneinfoZip is the IANA time zone database every replica loads a
// window's zone from: a copy of Go's own ($GOROOT/lib/time/zoneinfo.zip,
// the data time/tzdata embeds), in the binary.
//
// time.LoadLocation cannot be made to use only the embedded copy: it reads
// the host's /usr/share/zoneinfo first, when there is one. A replica on a
// host with zoneinfo then accepted names only a host has (right/UTC,
// posix/Europe/Paris, localtime), stored them, and a replica without
// (the release image is FROM scratch) answered 400 to every request of
// that tenant; two hosts with different tzdata releases could also put a
// reset at different instants. Loading from this copy alone, every replica
// of a build accepts the same names and computes the same boundaries.
// `go generate ./budget/rule` refreshes it from the toolchain's.
//
//go:generate sh -c "cp \"$(go env GOROOT)/lib/time/zoneinfo.zip\" zoneinfo.zip"
//go:embed zoneinfo.zip
var zoneinfoZip []byte

var (
	zoneFilesOnce sync.Once
	zoneFiles     map[string]*zip.File
	zoneCache     sync.Map // name -> *time.Location, loaded once: a Location is immutable
)

// embeddedZone loads the zone name from zoneinfoZip; ok is false when the
// database has no such zone. "UTC" is time.UTC, as time.LoadLocation
// returns it, so that a UTC window is recognised as the plain period.
func embeddedZone(name string) (loc *time.Location, ok bool) {
	if name == "UTC" {
		return time.UTC, true
	}
	if l, ok := zoneCache.Load(name); ok {
		return l.(*time.Location), true
	}
	zoneFilesOnce.Do(func() {
		r, err := zip.NewReader(bytes.NewReader(zoneinfoZip), int64(len(zoneinfoZip)))
		if err != nil {
			panic("budget: the embedded zoneinfo.zip is corrupt: " + err.Error()) // a build defect, caught by every window test
		}
		zoneFiles = make(map[string]*zip.File, len(r.File))
		for _, f := range r.File {
			zoneFiles[f.Name] = f
		}
	})
	f, ok := zoneFiles[name]
	if !ok {
		return nil, false
	}
	rc, err := f.Open()
	if err != nil {
		return nil, false
	}
	defer rc.Close()
	data, err := io.ReadAll(rc)
	if err != nil {
		return nil, false
	}
	l, err := time.LoadLocationFromTZData(name, data)
	if err != nil {
		return nil, false
	}
	got, _ := zoneCache.LoadOrStore(name, l)
	return got.(*time.Location), true
}

// parseZone reads a zone a caller names (the API, the CLI, the dashboard):
// an IANA name of the embedded database, "" for UTC. Any other name is a
// *LimitError naming the field: "Local" (the host's zone), and the names
// only some hosts have (right/, posix/, localtime), since a zone one
// replica accepts must load on every replica.
func parseZone(name string) (*time.Location, error) {
	switch {
	case name == "":
		return time.UTC, nil
	case name == "Local":
		return nil, &LimitError{windowFieldZone, `"Local" is the host's zone: name an IANA zone such as "Europe/Paris"`}
	case len(name) > 64 || TextProblem(name) != "":
		return nil, &LimitError{windowFieldZone, "must be an IANA time zone name such as \"Europe/Paris\""}
	}
	if loc, ok := embeddedZone(name); ok {
		return loc, nil
	}
	if rest, ok := nonPortable(name); ok {
		return nil, &LimitError{windowFieldZone, fmt.Sprintf("%q is a variant of the zone database that not every host has: name %q", name, rest)}
	}
	return nil, &LimitError{windowFieldZone, fmt.Sprintf("unknown time zone %q: want an IANA name such as \"Europe/Paris\"", name)}
}

// nonPortable strips the prefix of the zone database's host-only variants:
// posix/X is X, and right/X is X counting leap seconds, which Go's clock
// never does.
func nonPortable(name string) (rest string, ok bool) {
	for _, p := range []string{"right/", "posix/"} {
		if r, found := strings.CutPrefix(name, p); found {
			if _, known := embeddedZone(r); known {
				return r, true
			}
		}
	}
	return "", false
}

// StoredZone reads a zone from a stored row (a tenant's windows, an
// end-user template), which an older build may have accepted from a host's
// zoneinfo. It never fails, because a failure here was a 400 to every
// request of the tenant, forever, for a configuration the tenant's caller
// cannot change:
//   - a name the database has loads as parseZone's;
//   - right/X and posix/X load as X, the same civil clock (Go ignores leap
//     seconds), and are written back as X at the tenant's next change;
//   - any other name (one only a host had, or one a newer build's database
//     added, during a rolling upgrade) keeps its name, so the limits show
//     and keep what the admin set, and counts in UTC until a build that
//     knows it; a change of the tenant's windows must then name a zone
//     this build knows (parseZone).
func StoredZone(name string) (*time.Location, error) {
	if loc, err := parseZone(name); err == nil {
		return loc, nil
	}
	if rest, ok := nonPortable(name); ok {
		loc, _ := embeddedZone(rest)
		return loc, nil
	}
	return time.FixedZone(name, 0), nil
}
