package lease

import (
	"sync"

	"github.com/tokengate/tokengate/budget/account"
)

// groupKey names a groups-shape journal's group (rule.AdmissionGroup
// without the place): its rows in lease_groups (a group split across
// transactions has several).
type groupKey struct {
	holder uint64
	count  uint32
}

// keptEvents keeps, for each lease a groups-shape store took, the events
// its journal committed for the lease since the lease's last Book, as
// their group rows hold them (account.LeasedGroup: the journal knows every
// admission it wrote, and its group's statement returns the seq, the time
// and the ends it made), so that Book writes their entries with no read
// of the group rows. Reading them cost a booking an index lookup and the
// row's arrays per group, once for every lease in the group: on 64
// tenants, 24 us of Postgres per request, where the rows shape's booking
// reads its admissions rows for 15 (BENCHMARKS.md, "Quota leasing,
// fifteenth step").
//
// Why the kept events are complete: a store's journal commits one group at
// a time (inFlight is 1) and keeps the group's events here after it
// committed, before the next group starts, in seq order. A group committed
// but not kept yet has a higher seq than every kept one, so a Book moves
// its lease's cursor no further than the last kept event, and the next
// Book, or the final reconcile under the lease row's lock (which scans
// the group rows from the cursor: its range is short), books it. A group
// whose outcome the journal does not know (a write that failed) forgets
// its leases: from then on they are booked by the scan, as a lease this
// store did not take (a dead replica's, swept here) is.
type keptEvents struct {
	mu sync.Mutex
	m  map[string][]account.LeasedAdmission
}

// know starts keeping leaseID's events (a take).
func (h *keptEvents) know(leaseID string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.m == nil {
		h.m = map[string][]account.LeasedAdmission{}
	}
	h.m[leaseID] = nil
}

// forget stops keeping leaseID's events (it ended, or a group of it was
// written with an outcome unknown).
func (h *keptEvents) forget(leaseIDs ...string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, id := range leaseIDs {
		delete(h.m, id)
	}
}

// keep adds each known lease's events, in their order.
func (h *keptEvents) keep(events map[string][]account.LeasedAdmission) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for id, es := range events {
		if kept, ok := h.m[id]; ok {
			h.m[id] = append(kept, es...)
		}
	}
}

// of returns a copy of leaseID's events, and whether the lease is known.
func (h *keptEvents) of(leaseID string) ([]account.LeasedAdmission, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	es, ok := h.m[leaseID]
	return append([]account.LeasedAdmission(nil), es...), ok
}

// drop removes the first n of leaseID's events (booked).
func (h *keptEvents) drop(leaseID string, n int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if es, ok := h.m[leaseID]; ok && n > 0 {
		h.m[leaseID] = append(es[:0:0], es[min(n, len(es)):]...)
	}
}
