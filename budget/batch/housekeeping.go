package batch

import (
	"context"
	_ "embed"
	"fmt"
	"sync"
	"time"
)

//go:embed sql/file_purge.sql
var filePurgeSQL string

// Retention of batch file records (batch_files and their lines): an input
// file no batch was made of is purged UnusedFileRetention after its
// upload (a batch made later finds no file: the upstream keeps its own
// copy, the client uploads again); a file batches were made of is purged
// EndedFileRetention after the last of them ended, by which time every
// report of them has come. The batches and their lines stay: they are
// what the ledger's entries point an auditor to.
const (
	UnusedFileRetention = 48 * time.Hour
	EndedFileRetention  = 30 * 24 * time.Hour
)

// PurgeFiles deletes up to limit file records past their retention, and
// says how many. Every replica's sweeper may run it at once. A file read
// by a reserve in flight is locked by it (file_get.sql's FOR SHARE), so a
// batch never copies the lines of a file being purged.
func (s *Service) PurgeFiles(ctx context.Context, limit int) (int, error) {
	now, err := s.now(ctx)
	if err != nil {
		return 0, err
	}
	tag, err := s.store.Pool().Exec(ctx, filePurgeSQL, now.Add(-UnusedFileRetention), now.Add(-EndedFileRetention), limit)
	if err != nil {
		return 0, fmt.Errorf("batch: purge files: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// Stats are what a Service has done since it was built, for metrics (as
// pgx's Stat): the faces export them (the proxy, to Prometheus), the
// domain only counts.
type Stats struct {
	// Created counts batches reserved, by provider; Refused the reserves
	// refused (allowance, money window, key, tenant).
	Created map[string]int64
	Refused int64
	// Ended counts batches ended, by how: EndParams.Status (completed,
	// failed, expired, cancelled, refused, ended: Anthropic's), "other"
	// for any other word.
	Ended map[string]int64
	// LinesSettled and LinesRefunded count the lines ended.
	LinesSettled, LinesRefunded int64
}

// stats is a Service's running Stats.
type stats struct {
	mu sync.Mutex
	s  Stats
}

func (st *stats) created(provider string, err error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if err != nil {
		st.s.Refused++
		return
	}
	if st.s.Created == nil {
		st.s.Created = map[string]int64{}
	}
	st.s.Created[provider]++
}

func (st *stats) ended(status string, sum Summary) {
	if sum.Already {
		return
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.s.Ended == nil {
		st.s.Ended = map[string]int64{}
	}
	switch status {
	case "completed", "ended", "refused", "failed", Expired, Cancelled:
	default:
		status = "other" // an upstream's word of its own: a label of bounded values
	}
	st.s.Ended[status]++
	st.s.LinesSettled += int64(sum.Settled)
	st.s.LinesRefunded += int64(sum.Refunded)
}

// Stats returns a copy of what s has done since it was built.
func (s *Service) Stats() Stats {
	s.stats.mu.Lock()
	defer s.stats.mu.Unlock()
	out := s.stats.s
	out.Created, out.Ended = map[string]int64{}, map[string]int64{}
	for k, v := range s.stats.s.Created {
		out.Created[k] = v
	}
	for k, v := range s.stats.s.Ended {
		out.Ended[k] = v
	}
	return out
}
