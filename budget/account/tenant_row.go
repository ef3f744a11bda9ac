package account

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/ledger"
)

// tenantRow is a row of tenants, as every query of it reads it
// (tenant_*.sql and end_user_*.sql name its columns: a column a later
// release adds is not read, so this release survives that migration),
// scanned by column name.
type tenantRow struct {
	ID                 string     `db:"id"`
	DisabledAt         *time.Time `db:"disabled_at"`
	CreatedAt          time.Time  `db:"created_at"`
	TokensCapacity     int64      `db:"tokens_capacity"`
	TokensRateMicro    int64      `db:"tokens_rate_micro"`
	RequestsCapacity   *int64     `db:"requests_capacity"`
	RequestsRateMicro  *int64     `db:"requests_rate_micro"`
	MaxConcurrent      *int64     `db:"max_concurrent"`
	Windows            []byte     `db:"windows"`
	ReservationTTLMS   int64      `db:"reservation_ttl_ms"`
	TokensMicro        int64      `db:"tokens_micro"`
	TokensAt           time.Time  `db:"tokens_at"`
	RequestsMicro      *int64     `db:"requests_micro"`
	RequestsAt         *time.Time `db:"requests_at"`
	OpenReservations   int64      `db:"open_reservations"`
	WindowUsage        []byte     `db:"window_usage"`
	LedgerSeq          int64      `db:"ledger_seq"`
	LedgerHash         []byte     `db:"ledger_hash"`
	MaxWaitMS          int64      `db:"max_wait_ms"`
	OnStoreUnavailable *string    `db:"on_store_unavailable"`
	ParentID           *string    `db:"parent_id"`
	Path               []string   `db:"path"`
	Depth              int        `db:"depth"`
	ShadowLimits       []string   `db:"shadow_limits"`
	ModelLimits        int        `db:"model_limits"`
	EndUserOf          *string    `db:"end_user_of"`
	EndUserID          *string    `db:"end_user_id"`
	EndUserExpiredAt   *time.Time `db:"end_user_expired_at"`
	AllowedModels      []string   `db:"allowed_models"`

	decodeErr error
}

// tenant is a tenant as a decision holds it: its TenantState, and the ledger
// chain head that its entries extend.
type tenant struct {
	rule.TenantState
	id          string
	path        []string // ancestors, root first (immutable)
	disabled    bool
	head        ledger.Head
	modelLimits int // how many model limits it has
	// models is the tenant's model scope (empty: every model): a request's
	// model must pass it, and its ancestors' (rule.CheckModelScopes).
	models       []string
	pendingFill  int64 // token refill not yet attributed to a ledger entry
	periodRolled bool
	// locked is the windows' usage as the row was read: the decision's
	// writes compare against it for alert thresholds.
	locked []rule.WindowUsage
	// endUserOf is the tenant whose end user this is ("" for none), and
	// endUserExpired whether it idled out (enduser.go).
	endUserOf      string
	endUserExpired bool
}

func deref0[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

func (r *tenantRow) tenant() *tenant {
	l := rule.Limits{
		TokensCapacity:     r.TokensCapacity,
		TokensRateMicro:    r.TokensRateMicro,
		RequestsCapacity:   deref0(r.RequestsCapacity),
		RequestsRateMicro:  deref0(r.RequestsRateMicro),
		MaxConcurrent:      deref0(r.MaxConcurrent),
		ReservationTTL:     time.Duration(r.ReservationTTLMS) * time.Millisecond,
		MaxWait:            time.Duration(r.MaxWaitMS) * time.Millisecond,
		OnStoreUnavailable: rule.Policy(deref0(r.OnStoreUnavailable)),
	}
	// The columns only ever hold what ParseLimitSet and validateWindows
	// accepted.
	l.Shadow, _ = rule.ParseLimitSet("shadow", r.ShadowLimits)
	var usage []rule.WindowUsage
	l.Windows, usage, r.decodeErr = rule.DecodeWindows(r.Windows, r.WindowUsage)
	l.SyncPeriod()
	t := &tenant{
		modelLimits:    r.ModelLimits,
		models:         r.AllowedModels,
		id:             r.ID,
		path:           r.Path,
		disabled:       r.DisabledAt != nil,
		endUserOf:      deref0(r.EndUserOf),
		endUserExpired: r.EndUserExpiredAt != nil,
		head:           ledger.Head{Seq: r.LedgerSeq, Hash: r.LedgerHash},
		TenantState: rule.TenantState{
			Limits:  l,
			Tokens:  rule.Bucket{CapacityMicro: l.TokensCapacity * rule.Micro, RateMicro: l.TokensRateMicro, BalanceMicro: r.TokensMicro, At: r.TokensAt},
			Open:    r.OpenReservations,
			Windows: usage,
		},
	}
	t.locked = slices.Clone(usage)
	if l.RequestsCapacity > 0 {
		t.Requests = rule.Bucket{CapacityMicro: l.RequestsCapacity * rule.Micro, RateMicro: l.RequestsRateMicro, BalanceMicro: l.RequestsCapacity * rule.Micro}
		if r.RequestsMicro != nil && r.RequestsAt != nil {
			t.Requests.BalanceMicro, t.Requests.At = *r.RequestsMicro, *r.RequestsAt
		}
	}
	return t
}

// scanTenants reads tenant rows, by id.
func scanTenants(rows pgx.Rows, err error) (map[string]*tenant, error) {
	if err != nil {
		return nil, err
	}
	rs, err := pgx.CollectRows(rows, pgx.RowToAddrOfStructByName[tenantRow])
	if err != nil {
		return nil, fmt.Errorf("budget: scan tenants: %w", err)
	}
	out := make(map[string]*tenant, len(rs))
	for _, r := range rs {
		out[r.ID] = r.tenant()
		if r.decodeErr != nil {
			return nil, r.decodeErr
		}
	}
	return out, nil
}

// scanTenant reads one tenant row. It returns ErrTenantNotFound.
func scanTenant(rows pgx.Rows, err error) (*tenant, error) {
	if err != nil {
		return nil, err
	}
	r, err := pgx.CollectOneRow(rows, pgx.RowToAddrOfStructByName[tenantRow])
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, rule.ErrTenantNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("budget: scan tenant: %w", err)
	}
	t := r.tenant()
	return t, r.decodeErr
}

// advance brings every balance to now (TenantState.Advance); the token refill is
// held in pendingFill until an entry records it.
func (t *tenant) advance(now time.Time) {
	refill, rolled := t.Advance(now)
	t.pendingFill += refill
	t.periodRolled = t.periodRolled || rolled
}

// entry starts a ledger entry for a change at now, attributing any pending
// refill to it. The caller fills the kind-specific fields and calls seal.
func (t *tenant) entry(kind ledger.Kind, now time.Time, actor string) *ledger.Entry {
	e := &ledger.Entry{
		TenantID:    t.id,
		Kind:        kind,
		CreatedAt:   now,
		RefillMicro: t.pendingFill,
		Actor:       actor,
	}
	t.pendingFill = 0
	return e
}

// seal completes e with the balances after the change and chains it.
func (t *tenant) seal(e *ledger.Entry) {
	e.BalanceMicro = t.Tokens.BalanceMicro
	e.PeriodStart, e.PeriodUsed, e.Windows = t.windowsOfEntry()
	t.head = t.head.Seal(e)
}

func (t *tenant) snapshot(now time.Time) rule.Snapshot {
	s := t.TenantState.Snapshot(t.id, now)
	s.Disabled = t.disabled
	s.LedgerSeq = t.head.Seq
	s.Path = t.path
	s.Models = t.models
	return s
}

// windowsOfEntry is what an entry records of the windows after its change:
// the "period" window's start and usage in the columns that held the
// period budget's (the first window's when none is named so), and every
// window's usage as "name=used,name=used" ("" without windows).
func (t *tenant) windowsOfEntry() (start *time.Time, used int64, all string) {
	ws := t.Limits.Windows
	if len(ws) == 0 || len(t.TenantState.Windows) != len(ws) {
		return nil, 0, ""
	}
	pick := 0
	var b strings.Builder
	for i, w := range ws {
		if w.Name == rule.PeriodWindowName {
			pick = i
		}
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(w.Name)
		b.WriteByte('=')
		b.WriteString(strconv.FormatInt(t.TenantState.Windows[i].Used, 10))
	}
	u := t.TenantState.Windows[pick]
	return u.Start, u.Used, b.String()
}
