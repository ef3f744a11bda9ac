package lease

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/ledger"
)

var (
	//go:embed sql/mode_get.sql
	modeGetSQL string
	//go:embed sql/mode_lock_get.sql
	modeLockGetSQL string
	//go:embed sql/mode_put.sql
	modePutSQL string
)

// Mode is a tenant's lease mode.
type Mode string

// The lease modes. Off is every tenant's until an administrator sets auto:
// leasing must earn its place tenant by tenant.
const (
	// ModeOff: every admission of the tenant is decided exactly.
	ModeOff Mode = "off"
	// ModeAuto: replicas lease the tenant's budget, unless a level of
	// its tree has a rule only exact mode keeps (then it stays exact).
	ModeAuto Mode = "auto"
)

// ParseMode reads a mode as the faces take it. It returns a
// *rule.LimitError (field "lease") for anything but off or auto.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case ModeOff, ModeAuto:
		return m, nil
	}
	return "", &rule.LimitError{Field: "lease", Reason: `must be "off" or "auto"`}
}

// SetModeParams sets a tenant's lease mode.
type SetModeParams struct {
	TenantID string
	Mode     Mode
	Actor    string
}

// ModeState is a tenant's lease mode, and what keeps it exact.
type ModeState struct {
	TenantID string
	Mode     Mode
	// ExactOnly names the first rule of a level of the tenant's tree that
	// keeps it in exact mode whatever its mode ("" when none), so that an
	// administrator who sets auto learns at once whether it applies.
	ExactOnlyTenant, ExactOnly string
}

// SetMode sets a tenant's lease mode under its row lock, with a limits
// entry (its detail the mode before and after) when it changes. Setting
// off ends the live leases of the tenant and its descendants in the same
// transaction (EndLocked, then EndCut), so that the journal refuses their
// next admission at once. It returns a *rule.LimitError for a mode that is
// not one, or rule.ErrTenantNotFound.
func (s *Store) SetMode(ctx context.Context, p SetModeParams) (ModeState, error) {
	if _, err := ParseMode(string(p.Mode)); err != nil {
		return ModeState{}, err
	}
	actor := p.Actor
	if actor == "" {
		actor = "admin"
	}
	out := ModeState{TenantID: p.TenantID, Mode: p.Mode}
	var ended Ended
	_, err := s.acct.LockedLevels(ctx, p.TenantID, func(ctx context.Context, q account.LockedQuerier, now time.Time, levels []account.Level) ([]account.LevelMove, error) {
		for _, lv := range levels {
			if lv.ExactOnly != "" {
				out.ExactOnlyTenant, out.ExactOnly = lv.TenantID, lv.ExactOnly
				break
			}
		}
		var before Mode
		if err := q.QueryRow(ctx, modeLockGetSQL, p.TenantID).Scan(&before); err != nil {
			return nil, fmt.Errorf("lease: mode: %w", err)
		}
		var moves []account.LevelMove
		if p.Mode == ModeOff {
			m, e, err := s.EndLocked(ctx, q, now, levels)
			if err != nil {
				return nil, err
			}
			moves, ended = m, e
		}
		if before == p.Mode {
			return moves, nil
		}
		if _, err := q.Exec(ctx, modePutSQL, p.TenantID, string(p.Mode), now, actor); err != nil {
			return nil, fmt.Errorf("lease: set mode: %w", err)
		}
		detail, err := json.Marshal(map[string]map[string]Mode{"lease_mode": {"before": before, "after": p.Mode}})
		if err != nil {
			return nil, fmt.Errorf("lease: encode mode: %w", err)
		}
		return append(moves, account.LevelMove{TenantID: p.TenantID, Kind: ledger.KindLimits, Actor: actor, Reason: "lease mode", Detail: string(detail)}), nil
	})
	if err != nil {
		return ModeState{}, err
	}
	s.dropModes() // this replica's copy (Auto) sees the change at once
	// The cut leases already refuse every admission; one EndCut fails to
	// end is a sweeper's work at once (it is past its expiry).
	_ = s.EndCut(ctx, ended)
	return out, nil
}

// ModeOf returns a tenant's lease mode (ModeOff unless set), or
// rule.ErrTenantNotFound.
func (s *Store) ModeOf(ctx context.Context, tenantID string) (Mode, error) {
	var m Mode
	err := s.acct.Pool().QueryRow(ctx, modeGetSQL, tenantID).Scan(&m)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", rule.ErrTenantNotFound
	}
	if err != nil {
		return "", fmt.Errorf("lease: mode of %s: %w", tenantID, err)
	}
	return m, nil
}
