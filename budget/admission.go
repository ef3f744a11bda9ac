package budget

import (
	"crypto/rand"
	"encoding/base32"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tokengate/tokengate/estimator"
)

// State is where an admission is in its life.
type State string

// The states of an admission.
const (
	StateReserved State = "reserved"
	StateSettled  State = "settled"
	StateReleased State = "released"
	StateExpired  State = "expired"
)

// Admission is one reserved estimate and its reconciliation.
type Admission struct {
	ID       string
	TenantID string
	State    State
	// Estimate is what was reserved, with the weights that settle applies
	// to the actual usage (later model-table edits do not change it).
	Estimate        estimator.Estimate
	CreatedAt       time.Time
	ExpiresAt       time.Time
	EndedAt         *time.Time
	Late            bool
	ActualInput     *int64
	ActualOutput    *int64
	ActualCost      *int64
	EndDeltaMicro   *int64 // effective change of the balance at settle or release
	EndBalanceMicro *int64 // balance right after it
}

func scanAdmission(row pgx.Row) (*Admission, error) {
	var a Admission
	var state string
	e := &a.Estimate
	err := row.Scan(&a.ID, &a.TenantID, &state, &e.Model, &e.InputTokens, &e.OutputTokens, &e.Cost, &e.Approximate,
		&e.InputWeightMicro, &e.OutputWeightMicro, &a.CreatedAt, &a.ExpiresAt,
		&a.EndedAt, &a.Late, &a.ActualInput, &a.ActualOutput, &a.ActualCost, &a.EndDeltaMicro, &a.EndBalanceMicro)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrAdmissionNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("budget: scan admission: %w", err)
	}
	a.State = State(state)
	return &a, nil
}

func queueAdmissionEnd(b *pgx.Batch, a *Admission) {
	b.Queue(admissionEndSQL, a.ID, string(a.State), a.EndedAt, a.Late, a.ActualInput, a.ActualOutput, a.ActualCost,
		a.EndDeltaMicro, a.EndBalanceMicro)
}

var idEncoding = base32.NewEncoding("0123456789abcdefghjkmnpqrstvwxyz").WithPadding(base32.NoPadding)

// NewAdmissionID is newAdmissionID for replicas that admit without the
// store (the local failure policy): their ids must never collide with the
// store's.
func NewAdmissionID(now time.Time) string { return newAdmissionID(now) }

// newAdmissionID returns "adm_" and 26 characters: 48 bits of milliseconds
// (so ids sort by creation, keeping the index append-mostly) and 80 random
// bits.
func newAdmissionID(now time.Time) string {
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], uint64(now.UnixMilli())<<16)
	_, _ = rand.Read(b[6:])
	return "adm_" + idEncoding.EncodeToString(b[:])
}
