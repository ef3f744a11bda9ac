package replica

import "github.com/tokengate/tokengate/budget/lease"

// SliceFor is sliceFor, for its table test.
var SliceFor = sliceFor

// HolderState is what the replica's holder of tenantID holds (zero before
// its first use).
func HolderState(l *Leases, tenantID string) lease.HolderState {
	l.mu.Lock()
	hd, ok := l.holders[tenantID]
	l.mu.Unlock()
	if !ok {
		return lease.HolderState{}
	}
	return hd.h.State()
}
