package outage

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
)

// Kind of a spool record.
type Kind string

// The record kinds.
const (
	KindReserve Kind = "reserve"
	KindSettle  Kind = "settle"
	KindRelease Kind = "release"
)

// Record is one decision made without the store. It is the spool's on-disk
// format: every field is tagged, and a field may be added but never renamed.
type Record struct {
	Kind         Kind                    `json:"kind"`
	AdmissionID  string                  `json:"admission_id"`
	TenantID     string                  `json:"tenant_id"`
	Estimate     *account.StoredEstimate `json:"estimate,omitempty"`
	CreatedAt    time.Time               `json:"created_at"`
	ExpiresAt    time.Time               `json:"expires_at,omitzero"`
	InputTokens  int64                   `json:"input_tokens,omitempty"`
	OutputTokens int64                   `json:"output_tokens,omitempty"`
	Actor        string                  `json:"actor,omitempty"`
	// IdempotencyKey and RequestHash are the admission's Idempotency-Key
	// and request fingerprint; Response is the admission as it was
	// answered. The replay writes them to the store with the admission, so
	// that a retry after the outage returns it instead of debiting again.
	//
	// On a settle or release, IdempotencyKey names the admission instead of
	// AdmissionID (which is then empty): one the store made, which this
	// replica cannot resolve while the store is away; the replay settles
	// it by key (account.SettleParams.IdempotencyKey).
	IdempotencyKey string          `json:"idempotency_key,omitempty"`
	RequestHash    []byte          `json:"request_hash,omitempty"`
	Response       json.RawMessage `json:"response,omitempty"`
	// CachedInputTokens, the cache writes and RefundTokens are a settle's usage as it was
	// stated (account.SettleParams): the replay's settle prices them with
	// the admission, as the store would have.
	CachedInputTokens  int64 `json:"cached_input_tokens,omitempty"`
	CacheWriteTokens   int64 `json:"cache_write_tokens,omitempty"`
	CacheWrite1hTokens int64 `json:"cache_write_1h_tokens,omitempty"`
	RefundTokens       int64 `json:"refund_tokens,omitempty"`
	// ReasoningTokens is the part of OutputTokens spent reasoning
	// (account.SettleParams.ReasoningTokens), kept for the replay's settle.
	ReasoningTokens int64 `json:"reasoning_tokens,omitempty"`
	// ServiceTier is, on a reserve, the price tier its request asked for
	// (estimator.Estimate.ServiceTier) and, on a settle, the tier its
	// upstream reported (account.SettleParams.ServiceTier): the replay
	// prices money at them as the store would have.
	ServiceTier string `json:"service_tier,omitempty"`
	// Defer is, on a settle or release by IdempotencyKey, the request's
	// failure policy as the replica knew it (account.SettleParams.Defer): if
	// the replay finds no admission for the key, because the replica that
	// made it on its own has not replayed it yet, the store keeps the
	// settle for that replay (account.ErrDeferred).
	Defer *account.Deferral `json:"defer,omitempty"`
	// Face is the face the decision came through (rule.Face): a reserve's
	// admission remembers it, a settle or release ends only its own face's
	// admissions, and IdempotencyKey is in its namespace. A record from
	// before faces were told apart has none: its face is read from its
	// Actor, as each face writes it (FaceOf).
	Face rule.Face `json:"face,omitempty"`
}

// FaceOf is the face of r: its Face, or for a record written before
// faces were told apart, the face its Actor names ("proxy:key:<id>",
// "gateway:<name>"; the API's "key:<id>" and anything else: the API).
func (r Record) FaceOf() rule.Face {
	switch {
	case r.Face != "":
		return r.Face
	case strings.HasPrefix(r.Actor, "proxy:"):
		return rule.FaceProxy
	case strings.HasPrefix(r.Actor, "gateway:"):
		return rule.FaceRLS
	}
	return rule.FaceAPI
}

// Spool is an append-only journal file, synced to disk on every append: a
// frontend that was told "admitted" can rely on the admission reaching the
// ledger even if this replica crashes the next instant.
//
// Crash guarantees: a record is one line, written with one write and synced
// before its decision is answered. A crash mid-write can only leave a last
// line without its newline, whose decision was never answered; OpenSpool
// cuts such a torn tail off (keeping its bytes in the rejected file), so
// records appended after a restart are never glued to it. A line that
// cannot be read for any other reason is moved to the rejected file with
// the reason, loudly, and never blocks the records after it.
type Spool struct {
	mu   sync.Mutex
	path string
	f    *os.File

	tornBytes int64        // cut off the tail at open
	rejected  atomic.Int64 // lines moved to the rejected file
}

// OpenSpool opens (or creates) the spool of replica in dir. A torn last
// line (a crash mid-append) is cut off and kept in the rejected file; see
// TornBytes.
func OpenSpool(dir, replica string) (*Spool, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("outage: spool dir: %w", err)
	}
	path := filepath.Join(dir, replica+".spool")
	s := &Spool{path: path}
	if err := s.cutTornTail(); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("outage: open spool: %w", err)
	}
	s.f = f
	return s, nil
}

// cutTornTail truncates the spool after its last complete line.
func (s *Spool) cutTornTail() error {
	f, err := os.OpenFile(s.path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("outage: open spool: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(f)
	if err != nil {
		return fmt.Errorf("outage: read spool: %w", err)
	}
	keep := int64(bytes.LastIndexByte(data, '\n') + 1)
	if keep == int64(len(data)) {
		return nil
	}
	if err := s.reject(data[keep:], "torn tail: a crash cut this record short before it was answered"); err != nil {
		return err
	}
	if err := f.Truncate(keep); err != nil {
		return fmt.Errorf("outage: cut the torn tail: %w", err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("outage: cut the torn tail: %w", err)
	}
	s.tornBytes = int64(len(data)) - keep
	return nil
}

// Path is the spool file's path.
func (s *Spool) Path() string { return s.path }

// RejectedPath is where lines that cannot be replayed are kept, one JSON
// object each ({"at","reason","line"}), for an operator to inspect.
func (s *Spool) RejectedPath() string { return s.path + ".rejected" }

// TornBytes is how many bytes of a torn last line OpenSpool cut off.
func (s *Spool) TornBytes() int64 { return s.tornBytes }

// Rejected counts the lines moved to the rejected file since the spool was
// opened (the torn tail included).
func (s *Spool) Rejected() int64 { return s.rejected.Load() }

// reject appends line to the rejected file with its reason, synced.
func (s *Spool) reject(line []byte, reason string) error {
	entry, err := json.Marshal(struct {
		At     time.Time `json:"at"`
		Reason string    `json:"reason"`
		Line   string    `json:"line"`
	}{time.Now().UTC(), reason, string(bytes.TrimRight(line, "\n"))})
	if err != nil {
		return fmt.Errorf("outage: reject: %w", err)
	}
	f, err := os.OpenFile(s.RejectedPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("outage: reject: %w", err)
	}
	defer f.Close()
	if _, err := f.Write(append(entry, '\n')); err != nil {
		return fmt.Errorf("outage: reject: %w", err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("outage: reject: %w", err)
	}
	s.rejected.Add(1)
	return nil
}

// Append writes r and syncs it to disk before returning.
func (s *Spool) Append(r Record) error {
	line, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("outage: encode record: %w", err)
	}
	line = append(line, '\n')
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.f.Write(line); err != nil {
		return fmt.Errorf("outage: append: %w", err)
	}
	if err := s.f.Sync(); err != nil {
		return fmt.Errorf("outage: sync: %w", err)
	}
	return nil
}

// Line is one line of the spool: its record, or why it cannot be read.
type Line struct {
	Raw    []byte
	Record Record
	Err    error
}

// Lines reads every complete line, in order, and the spool's size at that
// moment (for Discard). A last line without its newline is still being
// written, or was torn by a crash: it is not returned.
func (s *Spool) Lines() ([]Line, int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	data, err := os.ReadFile(s.path)
	if err != nil {
		return nil, 0, fmt.Errorf("outage: read spool: %w", err)
	}
	end := bytes.LastIndexByte(data, '\n') + 1
	var out []Line
	for rest := data[:end]; len(rest) > 0; {
		i := bytes.IndexByte(rest, '\n')
		raw := rest[:i+1]
		rest = rest[i+1:]
		l := Line{Raw: raw}
		if err := json.Unmarshal(raw, &l.Record); err != nil {
			l.Err = fmt.Errorf("outage: spool record %d: %w", len(out)+1, err)
		}
		out = append(out, l)
	}
	return out, int64(end), nil
}

// Records reads every record that can be read, in order.
func (s *Spool) Records() ([]Record, error) {
	lines, _, err := s.Lines()
	if err != nil {
		return nil, err
	}
	var out []Record
	for _, l := range lines {
		if l.Err == nil {
			out = append(out, l.Record)
		}
	}
	return out, nil
}

// Len reports how many bytes the spool holds (0: nothing to replay).
func (s *Spool) Len() (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, err := s.f.Stat()
	if err != nil {
		return 0, err
	}
	return st.Size(), nil
}

// Discard removes the first n bytes (what Lines returned, once every line
// reached the store or the rejected file) and syncs; lines appended since
// are kept. The spool is replaced by a rename, so a crash leaves either the
// old spool or the new one, never a mix.
func (s *Spool) Discard(n int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	data, err := os.ReadFile(s.path)
	if err != nil {
		return fmt.Errorf("outage: discard: %w", err)
	}
	rest := data[min(n, int64(len(data))):]
	tmp := s.path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("outage: discard: %w", err)
	}
	if _, err := f.Write(rest); err != nil {
		f.Close()
		return fmt.Errorf("outage: discard: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("outage: discard: %w", err)
	}
	f.Close()
	if err := os.Rename(tmp, s.path); err != nil {
		return fmt.Errorf("outage: discard: %w", err)
	}
	if d, err := os.Open(filepath.Dir(s.path)); err == nil {
		_ = d.Sync() // make the rename durable
		d.Close()
	}
	nf, err := os.OpenFile(s.path, os.O_CREATE|os.O_RDWR|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("outage: reopen spool: %w", err)
	}
	s.f.Close()
	s.f = nf
	return nil
}

// Close closes the spool file.
func (s *Spool) Close() error { return s.f.Close() }
