package rule_test

import (
	"encoding/binary"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tokengate/tokengate/budget/rule"
)

// tzif is a zone file (TZif, version 1) of one fixed offset: what a host's
// zoneinfo directory holds.
func tzif(offset time.Duration, abbr string) []byte {
	b := append([]byte("TZif"), make([]byte, 16)...) // version 0 (1), 15 reserved bytes
	for _, n := range []uint32{0, 0, 0, 0, 1, uint32(len(abbr) + 1)} {
		b = binary.BigEndian.AppendUint32(b, n) // isutcnt, isstdcnt, leapcnt, timecnt, typecnt, charcnt
	}
	b = binary.BigEndian.AppendUint32(b, uint32(int32(offset/time.Second)))
	b = append(b, 0, 0) // not DST, abbreviation at 0
	return append(append(b, abbr...), 0)
}

// TestWindowZonesIgnoreTheHostsZoneinfo: a window's zone loads from the
// database built into tokengate, never from the host's, so a name only a
// host has (right/UTC, and here a made-up one) is refused on every host,
// and a zone's boundaries are the same on every host. The test runs itself
// in a child process whose ZONEINFO (the directory Go reads first) holds
// those names and a wrong Europe/Paris: the result cannot depend on the
// machine's /usr/share/zoneinfo.
func TestWindowZonesIgnoreTheHostsZoneinfo(t *testing.T) {
	if os.Getenv("TOKENGATE_TEST_ZONEINFO_CHILD") == "1" {
		zoneinfoChild(t)
		return
	}
	dir := t.TempDir()
	for name, data := range map[string][]byte{
		"right/UTC":     tzif(0, "UTC"),
		"Test/HostOnly": tzif(0, "UTC"),
		"Europe/Paris":  tzif(5*time.Hour, "FAKE"),
	} {
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if loc, err := time.LoadLocationFromTZData("x", tzif(5*time.Hour, "FAKE")); err != nil || time.Date(2026, 1, 1, 0, 0, 0, 0, loc).UTC().Hour() != 19 {
		t.Fatalf("the test's zone file does not load as +05:00: %v", err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestWindowZonesIgnoreTheHostsZoneinfo$", "-test.v")
	cmd.Env = append(os.Environ(), "ZONEINFO="+dir, "TOKENGATE_TEST_ZONEINFO_CHILD=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("with the host's zoneinfo in %s: %v\n%s", dir, err, out)
	}
}

func zoneinfoChild(t *testing.T) {
	for _, name := range []string{"right/UTC", "Test/HostOnly", "posix/Europe/Paris", "localtime"} {
		_, err := rule.ParseWindow("day", name, "", "")
		var le *rule.LimitError
		if !errors.As(err, &le) || le.Field != "window.time_zone" {
			t.Errorf("zone %q: %v, want a LimitError on window.time_zone", name, err)
		}
	}
	_, err := rule.ParseWindow("day", "right/UTC", "", "")
	if err == nil || !strings.Contains(err.Error(), `"UTC"`) {
		t.Errorf("right/UTC: %v, want the error to name the portable zone UTC", err)
	}
	w, err := rule.ParseWindow("day", "Europe/Paris", "", "")
	if err != nil {
		t.Fatal(err)
	}
	// Midnight in Paris in January is 23:00 UTC (+01:00), not the host
	// file's 19:00 (+05:00).
	if got, want := w.Start(time.Date(2026, 1, 15, 12, 0, 0, 0, time.UTC)), time.Date(2026, 1, 14, 23, 0, 0, 0, time.UTC); !got.Equal(want) {
		t.Errorf("a Europe/Paris day starts at %s, want %s", got.UTC(), want)
	}
}
