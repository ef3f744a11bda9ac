package rule

import (
	_ "embed"
)

// LimitPool is an upstream capacity pool's limit, as a rejection names it.
const LimitPool Limit = "pool"

// Priority is a key's class among requests waiting for a pool.
type Priority string

// The priority classes, first served first.
const (
	PriorityCritical  Priority = "critical"
	PriorityStandard  Priority = "standard"
	PrioritySheddable Priority = "sheddable"
)

// Rank orders the classes: critical 0, standard 1, sheddable 2 (an unknown
// class is standard).
func (p Priority) Rank() int {
	switch p {
	case PriorityCritical:
		return 0
	case PrioritySheddable:
		return 2
	}
	return 1
}

// Valid reports whether p is a class.
func (p Priority) Valid() bool {
	return p == PriorityCritical || p == PriorityStandard || p == PrioritySheddable
}

// PoolState is a pool as a decision left it: its balance, and each
// tenant's virtual token counter, for a replica to order the requests it
// holds waiting for the pool.
type PoolState struct {
	ID          string
	TokensMicro int64
	// VTC is each tenant's served raw tokens divided by its weight, in
	// micro units.
	VTC map[string]int64
}
