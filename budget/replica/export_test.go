package replica

import "github.com/tokengate/tokengate/budget/lease"

// MaxBacklog is maxBacklog.
const MaxBacklog = maxBacklog

// SliceFor is sliceFor, for its table test.
var SliceFor = sliceFor

// HolderState is what the replica's holder of tenantID holds (zero before
// its first use).
func HolderState(l *Leases, tenantID string) lease.HolderState {
	v, ok := l.holders.Load(tenantID)
	if !ok {
		return lease.HolderState{}
	}
	return v.(*held).h.State()
}
