package credential

// Gateway credentials: tgw_<id>_<secret>, in the shared format of token.go,
// scoped to the tenants a gateway may ask for.

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tokengate/tokengate/budget/rule"
)

var (
	//go:embed sql/gateway_insert.sql
	gatewayInsertSQL string
	//go:embed sql/gateway_auth.sql
	gatewayAuthSQL string
	//go:embed sql/gateway_list.sql
	gatewayListSQL string
	//go:embed sql/gateway_revoke.sql
	gatewayRevokeSQL string
)

// GatewayPrefix starts every gateway credential.
const GatewayPrefix = "tgw_"

// AllTenants scopes a gateway to every tenant.
const AllTenants = rule.GatewayAllTenants

var (
	// ErrGatewayInvalid: the gateway credential is missing, malformed,
	// unknown, wrong or revoked.
	ErrGatewayInvalid = errors.New("credential: invalid gateway credential")
	// ErrGatewayNotFound: no such unrevoked gateway credential.
	ErrGatewayNotFound = errors.New("credential: gateway not found")
	// ErrGatewayNameTaken: an unrevoked gateway already has that name.
	ErrGatewayNameTaken = errors.New("credential: gateway name taken")
	// ErrGatewayBadScope: a gateway is scoped to 1 to 1000 tenant ids, or "*".
	ErrGatewayBadScope = errors.New("credential: a gateway needs a name of 1 to 64 printable characters and 1 to 1000 tenants (or *)")
)

// Gateway is a gateway credential; it never holds the secret. Its Name is
// the actor its requests are recorded with in the ledger.
type Gateway struct {
	ID         string     `json:"id" db:"id"`
	Name       string     `json:"name" db:"name"`
	SecretHash []byte     `json:"-" db:"secret_hash"`
	Tenants    []string   `json:"tenants" db:"tenants"`
	CreatedAt  time.Time  `json:"created_at" db:"created_at"`
	LastUsedAt *time.Time `json:"last_used_at" db:"last_used_at"`
	RevokedAt  *time.Time `json:"revoked_at" db:"revoked_at"`
}

// May reports whether the gateway may ask on behalf of tenantID: the
// domain's one rule (rule.GatewayMay), which a decision also applies to
// a request's GatewayID in its own transaction.
func (g Gateway) May(tenantID string) bool {
	return rule.GatewayMay(g.Tenants, tenantID)
}

// GatewayCreate makes a gateway credential scoped to tenants and returns it
// with its secret, which is not stored and cannot be recovered. It returns
// ErrGatewayBadScope or ErrGatewayNameTaken.
func GatewayCreate(ctx context.Context, db DB, name string, tenants []string) (Gateway, string, error) {
	name = strings.TrimSpace(name)
	if !validName(name) || len(tenants) == 0 || len(tenants) > 1000 {
		return Gateway{}, "", ErrGatewayBadScope
	}
	for _, t := range tenants {
		if t == "" {
			return Gateway{}, "", ErrGatewayBadScope
		}
	}
	id, secret, full := Generate(GatewayPrefix)
	g := Gateway{ID: id, Name: name, Tenants: tenants}
	err := db.QueryRow(ctx, gatewayInsertSQL, id, name, HashSecret(secret), tenants).Scan(&g.CreatedAt)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == pgerrcode.UniqueViolation {
		return Gateway{}, "", ErrGatewayNameTaken
	}
	if err != nil {
		return Gateway{}, "", fmt.Errorf("credential: create gateway: %w", err)
	}
	return g, full, nil
}

// GatewayAuthenticate returns the gateway a presented credential belongs
// to. It returns ErrGatewayInvalid for anything but a valid, unrevoked one.
func GatewayAuthenticate(ctx context.Context, db DB, presented string) (Gateway, error) {
	id, secret, ok := Parse(GatewayPrefix, presented)
	if !ok {
		return Gateway{}, ErrGatewayInvalid
	}
	rows, err := db.Query(ctx, gatewayAuthSQL, id)
	if err != nil {
		return Gateway{}, fmt.Errorf("credential: authenticate gateway: %w", err)
	}
	g, err := pgx.CollectOneRow(rows, pgx.RowToStructByName[Gateway])
	if errors.Is(err, pgx.ErrNoRows) {
		return Gateway{}, ErrGatewayInvalid
	}
	if err != nil {
		return Gateway{}, fmt.Errorf("credential: authenticate gateway: %w", err)
	}
	if !Equal(g.SecretHash, secret) || g.RevokedAt != nil {
		return Gateway{}, ErrGatewayInvalid
	}
	return g, nil
}

// GatewayList returns every gateway credential, revoked ones included.
func GatewayList(ctx context.Context, db DB) ([]Gateway, error) {
	rows, err := db.Query(ctx, gatewayListSQL)
	if err != nil {
		return nil, fmt.Errorf("credential: list gateways: %w", err)
	}
	gs, err := pgx.CollectRows(rows, pgx.RowToStructByName[Gateway])
	if err != nil {
		return nil, fmt.Errorf("credential: list gateways: %w", err)
	}
	return gs, nil
}

// GatewayRevoke revokes a gateway credential. It returns ErrGatewayNotFound.
func GatewayRevoke(ctx context.Context, db DB, id string) error {
	_, err := GatewayRevokeScope(ctx, db, id)
	return err
}

// GatewayRevokeScope revokes a gateway credential and returns the tenants
// it was scoped to, so that the caller's transaction can lock what the
// gateway could still be admitting from (lease.Store.LockLiveGateway). It
// returns ErrGatewayNotFound.
func GatewayRevokeScope(ctx context.Context, db DB, id string) ([]string, error) {
	var scope []string
	err := db.QueryRow(ctx, gatewayRevokeSQL, id).Scan(&scope)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrGatewayNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("credential: revoke gateway: %w", err)
	}
	return scope, nil
}
