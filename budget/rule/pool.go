package rule

import (
	"errors"
	"fmt"
	"time"
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

// ErrPoolNotFound: no pool has that id.
var ErrPoolNotFound = errors.New("budget: pool not found")

// ErrPoolExists: CreatePool found the id taken.
var ErrPoolExists = errors.New("budget: pool already exists")

// PoolLimits are a pool's token bucket, in raw tokens (input + output).
type PoolLimits struct {
	TokensCapacity  int64
	TokensRateMicro int64
}

// Validate returns a *LimitError naming the first invalid field.
func (l PoolLimits) Validate() error {
	switch {
	case l.TokensCapacity <= 0 || l.TokensCapacity > MaxAmount:
		return &LimitError{Field: "tokens_capacity", Reason: fmt.Sprintf("must be between 1 and %d", int64(MaxAmount))}
	case l.TokensRateMicro <= 0 || l.TokensRateMicro > MaxAmount*Micro/1000:
		return &LimitError{Field: "tokens_per_second", Reason: "must be greater than 0 (and at most 1e9)"}
	}
	return nil
}

// PoolShare is one tenant's share of a pool.
type PoolShare struct {
	TenantID string
	Weight   int64
	// VTCMicro is the virtual token counter: served / weight, in micro units.
	VTCMicro int64
	Served   int64
}

// PoolSnapshot is a pool, its models and its shares at one instant.
type PoolSnapshot struct {
	ID          string
	Limits      PoolLimits
	TokensMicro int64
	Models      []string
	Shares      []PoolShare
	At          time.Time
}

// MaxPoolWeight is the largest weight of a tenant's share of a pool.
const MaxPoolWeight = 1_000_000

// ValidatePoolWeight returns a *LimitError unless weight is a share's
// weight: 1 to MaxPoolWeight.
func ValidatePoolWeight(weight int64) error {
	if weight < 1 || weight > MaxPoolWeight {
		return &LimitError{Field: "weight", Reason: "must be between 1 and 1000000"}
	}
	return nil
}

// PoolActiveWindow is how recently a tenant must have been served from a
// pool to count as backlogged there. A tenant that returns after a longer
// pause has its counter lifted to the lowest counter of those still
// active, as the virtual token counter prescribes: idle time earns no
// credit to crowd out the tenants that kept the pool busy.
const PoolActiveWindow = 10 * time.Second

// Pool is an upstream capacity pool as one decision holds it under its
// row lock: its bucket of raw tokens, and the shares of the tenants it
// served (fair share by virtual token counter: each tenant's served
// tokens divided by its weight). Changed says whether the decision changed
// it, and so whether the store writes it.
type Pool struct {
	ID      string
	Tokens  Bucket
	Shares  map[string]*Share
	Changed bool
}

// Share is one tenant's share of a pool.
type Share struct {
	TenantID string
	// Weight divides what the tenant is served into its counter: weight 2
	// is served twice as much as weight 1 for the same counter.
	Weight int64
	// VTCMicro is the virtual token counter, in micro units.
	VTCMicro int64
	// Served is every raw token the pool served the tenant.
	Served   int64
	ActiveAt *time.Time
	Changed  bool
}

// shareOf is tenantID's share of the pool (weight 1 until an admin says
// otherwise), its counter lifted if the tenant was idle (PoolActiveWindow)
// to the lowest counter of the tenants served meanwhile. A request that
// was already waiting for the pool (backlogged) was there before those
// tenants were served, which the counter's lift in the paper (on arrival,
// not on service) would credit: it is lifted to one pool's capacity below
// that floor instead, so a tenant that queued at the start is not robbed of
// its share, and one that returns after a long idle gains at most a bucket.
func (p *Pool) shareOf(tenantID string, now time.Time, backlogged bool) *Share {
	sh, ok := p.Shares[tenantID]
	if !ok {
		sh = &Share{TenantID: tenantID, Weight: 1}
		if p.Shares == nil {
			p.Shares = map[string]*Share{}
		}
		p.Shares[tenantID] = sh
	}
	if sh.ActiveAt == nil || now.Sub(*sh.ActiveAt) > PoolActiveWindow {
		floor := int64(-1)
		for _, o := range p.Shares {
			if o != sh && o.ActiveAt != nil && now.Sub(*o.ActiveAt) <= PoolActiveWindow && (floor < 0 || o.VTCMicro < floor) {
				floor = o.VTCMicro
			}
		}
		if backlogged && floor > 0 {
			floor = max(0, floor-p.Tokens.CapacityMicro/sh.Weight)
		}
		sh.VTCMicro = max(sh.VTCMicro, floor)
	}
	return sh
}

// Refusal is whether need raw tokens fit the pool while leaving holdback
// for the requests queued ahead of this one: a *TooLargeError past its
// capacity, a *RejectedError (with its Retry-After) past its balance, nil
// when they fit. It changes nothing.
func (p *Pool) Refusal(need, holdbackMicro int64) error {
	if need > p.Tokens.CapacityMicro/Micro {
		return &TooLargeError{Limit: LimitPool, Pool: p.ID, Cost: need, Capacity: p.Tokens.CapacityMicro / Micro}
	}
	want := need*Micro + max(0, holdbackMicro)
	if want > p.Tokens.BalanceMicro {
		return &RejectedError{Limit: LimitPool, Pool: p.ID, RetryAfter: RoundUpMS(p.Tokens.TimeUntil(want))}
	}
	return nil
}

// Serve takes need from the pool for tenantID and counts it to its share.
func (p *Pool) Serve(tenantID string, need int64, now time.Time, backlogged bool) {
	sh := p.shareOf(tenantID, now, backlogged)
	p.Tokens.BalanceMicro -= need * Micro
	sh.VTCMicro += need * Micro / sh.Weight
	sh.Served += need
	sh.ActiveAt = &now
	sh.Changed, p.Changed = true, true
}

// Correct moves a served amount to what was used (refund capped at the
// pool's capacity), and the tenant's counter with it.
func (p *Pool) Correct(tenantID string, reserved, used int64, now time.Time) {
	sh := p.shareOf(tenantID, now, false)
	p.Tokens.Refund((reserved - used) * Micro)
	sh.VTCMicro = max(0, sh.VTCMicro+(used-reserved)*Micro/sh.Weight)
	sh.Served += used - reserved
	sh.Changed, p.Changed = true, true
}

// State is the pool as the decision left it, for a replica to order the
// requests it holds waiting for it.
func (p *Pool) State() *PoolState {
	s := &PoolState{ID: p.ID, TokensMicro: p.Tokens.BalanceMicro, VTC: make(map[string]int64, len(p.Shares))}
	for id, sh := range p.Shares {
		s.VTC[id] = sh.VTCMicro
	}
	return s
}
