// Package outage is what a replica does while it cannot reach the store,
// under the local failure policy: it admits against its share of each
// tenant's bucket (capacity and refill divided by the replica count),
// journals every decision in a durable local spool, and replays the spool
// into the store, exactly once, when the store is back.
//
// Exactly once: a replayed admission keeps the id the replica gave it, and
// the store writes it only if no admission has that id (budget.ReplayReserve);
// settles and releases are idempotent in the store already. So a replay that
// a crash interrupts simply runs again from the start, and the spool is
// emptied only after every record is in the store.
package outage

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/tokengate/tokengate/estimator"
)

// Kind of a spool record.
type Kind string

// The record kinds.
const (
	KindReserve Kind = "reserve"
	KindSettle  Kind = "settle"
	KindRelease Kind = "release"
)

// Record is one decision made without the store.
type Record struct {
	Kind         Kind                `json:"kind"`
	AdmissionID  string              `json:"admission_id"`
	TenantID     string              `json:"tenant_id"`
	Estimate     *estimator.Estimate `json:"estimate,omitempty"`
	CreatedAt    time.Time           `json:"created_at"`
	ExpiresAt    time.Time           `json:"expires_at,omitzero"`
	InputTokens  int64               `json:"input_tokens,omitempty"`
	OutputTokens int64               `json:"output_tokens,omitempty"`
	Actor        string              `json:"actor,omitempty"`
}

// Spool is an append-only journal file, synced to disk on every append: a
// frontend that was told "admitted" can rely on the admission reaching the
// ledger even if this replica crashes the next instant.
type Spool struct {
	mu   sync.Mutex
	path string
	f    *os.File
}

// OpenSpool opens (or creates) the spool of replica in dir.
func OpenSpool(dir, replica string) (*Spool, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("outage: spool dir: %w", err)
	}
	path := filepath.Join(dir, replica+".spool")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("outage: open spool: %w", err)
	}
	return &Spool{path: path, f: f}, nil
}

// Path is the spool file's path.
func (s *Spool) Path() string { return s.path }

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

// Records reads every record, in order. A final line cut short by a crash
// mid-write is ignored: its decision was never answered.
func (s *Spool) Records() ([]Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.records()
}

func (s *Spool) records() ([]Record, error) {
	f, err := os.Open(s.path)
	if err != nil {
		return nil, fmt.Errorf("outage: read spool: %w", err)
	}
	defer f.Close()
	var out []Record
	rd := bufio.NewReader(f)
	for {
		line, err := rd.ReadBytes('\n')
		if errors.Is(err, io.EOF) {
			return out, nil // a partial last line (no newline) is dropped
		}
		if err != nil {
			return nil, fmt.Errorf("outage: read spool: %w", err)
		}
		var r Record
		if err := json.Unmarshal(line, &r); err != nil {
			return nil, fmt.Errorf("outage: spool record %d: %w", len(out)+1, err)
		}
		out = append(out, r)
	}
}

// Len reports how many bytes the spool holds (0: nothing to replay).
func (s *Spool) Len() (int64, error) {
	st, err := s.f.Stat()
	if err != nil {
		return 0, err
	}
	return st.Size(), nil
}

// Truncate empties the spool, after every record reached the store, and
// syncs the emptiness. If n records were read for the replay and more were
// appended since, those are kept.
func (s *Spool) Truncate(n int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	all, err := s.records()
	if err != nil {
		return err
	}
	rest := all[min(n, len(all)):]
	tmp := s.path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("outage: truncate: %w", err)
	}
	for _, r := range rest {
		line, _ := json.Marshal(r)
		if _, err := f.Write(append(line, '\n')); err != nil {
			f.Close()
			return fmt.Errorf("outage: truncate: %w", err)
		}
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("outage: truncate: %w", err)
	}
	f.Close()
	if err := os.Rename(tmp, s.path); err != nil {
		return fmt.Errorf("outage: truncate: %w", err)
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
