package account

// A groups-shape lease journal (budget/lease, 00039) writes a group's
// admissions as one lease_groups row, not an admissions row each
// (docs/leasing.md, "The compact journal"). The exact path decides on
// admissions rows, so an admission it names that lives only in a group row
// is copied into admissions first, in the decision's transaction, under
// its tenant's lock and its group's state row lock (groupCopy); the
// sweeper copies the overdue ones (CopyOverdueGroups). Nothing else of
// the exact path changes.

import (
	"context"
	_ "embed"
	"fmt"
	"time"

	"github.com/tokengate/tokengate/budget/rule"

	"github.com/jackc/pgx/v5"
)

var (
	//go:embed sql/admission_group_lock.sql
	admissionGroupLockSQL string
	//go:embed sql/admission_materialize.sql
	admissionMaterializeSQL string
	//go:embed sql/admission_materialize_overdue.sql
	admissionMaterializeOverdueSQL string
)

// groupCopy copies into admissions, after the lock round trip, the
// admissions the batch names that it did not find there and that may live
// in group rows: ids that name a group (rule.AdmissionGroupOf) and keys that
// named nothing. It then locks and reads them, and the leased events to
// book before them, as the lock round trip does for the others, in one
// more round trip, which only a batch that names such an admission makes.
func (s *Store) groupCopy(ctx context.Context, l *loaded, w wants, clock *time.Time) error {
	var ids []string
	for _, id := range w.admissions {
		if _, found := l.adms[id]; found {
			continue
		}
		if _, grouped := rule.AdmissionGroupOf(id); grouped {
			ids = append(ids, id)
		}
	}
	var keys tenantKeys
	for i, k := range w.namedBy.keys {
		if _, found := l.named[[2]string{w.namedBy.tenants[i], k}]; !found {
			keys.add(w.namedBy.tenants[i], k)
		}
	}
	if len(ids) == 0 && len(keys.keys) == 0 {
		return nil
	}
	b := &pgx.Batch{}
	b.Queue(admissionGroupLockSQL, ids, keys.tenants, keys.keys, clock)
	b.Queue(admissionMaterializeSQL, ids, keys.tenants, keys.keys, clock, w.tenants)
	reads := []read{admissionLockRead{ids: ids, namedBy: keys, clock: clock, l: l},
		leaseBookRead{ids: ids, namedBy: keys, clock: clock, l: l}}
	for _, r := range reads {
		r.queue(b)
	}
	countTrip(ctx)
	br := l.tx.conn.SendBatch(ctx, b)
	err := func() error {
		rows, err := br.Query()
		if err != nil {
			return fmt.Errorf("budget: lock groups: %w", err)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("budget: lock groups: %w", err)
		}
		if _, err := br.Exec(); err != nil {
			return fmt.Errorf("budget: copy grouped admissions: %w", err)
		}
		for _, r := range reads {
			if err := r.scan(br); err != nil {
				return err
			}
		}
		return nil
	}()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return l.tx.store.classify(ctx, err, false, false, l.tx.since)
	}
	return nil
}

// CopyOverdueGroups copies into admissions the overdue admissions of up to
// limit group rows whose earliest open expiry has passed (by the store's
// clock), marks them ended by the sweeper in their state rows, and moves
// each row's open_until to its next open expiry
// (admission_materialize_overdue.sql): the sweep then expires them as any
// overdue reservation, after their lease's booking. It returns how many
// group rows it read; the sweeper calls it until fewer than limit. Rows
// another sweep holds are skipped.
func (s *Store) CopyOverdueGroups(ctx context.Context, limit int) (int, error) {
	var n int
	if err := s.pool.QueryRow(ctx, admissionMaterializeOverdueSQL, limit, s.clock()).Scan(&n); err != nil {
		return 0, fmt.Errorf("budget: copy overdue grouped admissions: %w", err)
	}
	return n, nil
}
