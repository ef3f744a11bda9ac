package lease

import "sync"

// groupKey names a groups-shape journal's group (rule.AdmissionGroup
// without the place): its rows in lease_groups (a group split across
// transactions has several).
type groupKey struct {
	holder uint64
	count  uint32
}

// groupHints remembers, for each lease a groups-shape store took, the
// groups its journal committed with the lease in them since the lease's
// last Book, so that Book reads those group rows alone: a booking that
// scanned its holder's groups above its cursor read every group of every
// lease of the replica (a lease's booking on 64 tenants read 1,800 groups
// for the 30 of its own: 195 us of Postgres per request, BENCHMARKS.md,
// "Quota leasing, fourteenth step").
//
// Why the hints are complete: a store's journal commits one group at a
// time (inFlight is 1) and records the group's leases here after it
// committed, before the next group starts. A group committed but not yet
// recorded has a higher seq than every recorded one, so a Book that reads
// the hints moves its lease's cursor no further than the last recorded
// group, and the next Book, or the final reconcile under the lease row's
// lock (which scans from the cursor: its range is short), books it. A
// lease this store did not take (a dead replica's, swept here) has no
// hints, and is booked by the scan.
type groupHints struct {
	mu sync.Mutex
	m  map[string][]groupKey
}

// know starts remembering leaseID's groups (a take).
func (h *groupHints) know(leaseID string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.m == nil {
		h.m = map[string][]groupKey{}
	}
	h.m[leaseID] = nil
}

// forget stops remembering leaseID (it ended).
func (h *groupHints) forget(leaseID string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.m, leaseID)
}

// record adds group g to each known lease of leaseIDs (each once).
func (h *groupHints) record(g groupKey, leaseIDs []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, id := range leaseIDs {
		if gs, ok := h.m[id]; ok {
			h.m[id] = append(gs, g)
		}
	}
}

// of returns a copy of leaseID's groups, and whether the lease is known.
func (h *groupHints) of(leaseID string) ([]groupKey, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	gs, ok := h.m[leaseID]
	return append([]groupKey(nil), gs...), ok
}

// drop removes the first n of leaseID's groups (booked).
func (h *groupHints) drop(leaseID string, n int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if gs, ok := h.m[leaseID]; ok && n > 0 {
		h.m[leaseID] = append(gs[:0:0], gs[min(n, len(gs)):]...)
	}
}
