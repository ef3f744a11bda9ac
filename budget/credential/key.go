package credential

// Tenant API keys: tg_<id>_<secret>, in the shared format of token.go.

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
)

var (
	//go:embed sql/key_insert.sql
	keyInsertSQL string
	//go:embed sql/key_auth.sql
	keyAuthSQL string
	//go:embed sql/key_list.sql
	keyListSQL string
	//go:embed sql/key_revoke.sql
	keyRevokeSQL string
	//go:embed sql/key_set_priority.sql
	keySetPrioritySQL string
	//go:embed sql/key_touch.sql
	keyTouchSQL string
	//go:embed sql/key_set_models.sql
	keySetModelsSQL string
)

// KeyPrefix starts every tenant key, so that scanners can spot leaked keys.
const KeyPrefix = "tg_"

// Errors.
var (
	// ErrKeyInvalid: the presented key is malformed, unknown, wrong or revoked.
	// Callers must not tell these apart to the client; the errors below
	// wrap it so that a limiter can (only guesses should spend).
	ErrKeyInvalid = errors.New("credential: invalid key")
	// ErrKeyUnknown wraps ErrKeyInvalid: well formed, but no key has that id.
	ErrKeyUnknown = fmt.Errorf("%w: no key has that id", ErrKeyInvalid)
	// ErrKeyWrongSecret wraps ErrKeyInvalid: the id exists, the secret is wrong.
	ErrKeyWrongSecret = fmt.Errorf("%w: wrong secret", ErrKeyInvalid)
	// ErrKeyRevoked wraps ErrKeyInvalid: the right secret of a revoked key.
	ErrKeyRevoked = fmt.Errorf("%w: revoked", ErrKeyInvalid)
	// ErrTenantDisabled: the key is valid but its tenant is disabled.
	ErrTenantDisabled = errors.New("credential: tenant disabled")
	// ErrKeyNotFound: no such key for that tenant.
	ErrKeyNotFound = errors.New("credential: key not found")
	// ErrTenantNotFound: Create named a tenant that does not exist.
	ErrTenantNotFound = errors.New("credential: tenant not found")
)

// Key describes a stored key; it never holds the secret.
type Key struct {
	ID         string     `json:"id" db:"id"`
	TenantID   string     `json:"tenant_id" db:"tenant_id"`
	Prefix     string     `json:"prefix" db:"-"` // tg_<id>_, how the key starts
	CreatedAt  time.Time  `json:"created_at" db:"created_at"`
	LastUsedAt *time.Time `json:"last_used_at" db:"last_used_at"`
	RevokedAt  *time.Time `json:"revoked_at" db:"revoked_at"`
	// Priority is the key's class among requests waiting for an upstream
	// pool: critical, standard or sheddable.
	Priority string `json:"priority" db:"priority"`
	// Models is the key's model scope: exact names or '*' globs
	// (rule.ModelMatches), narrowing its tenant's; empty: every model the
	// tenant may use.
	Models []string `json:"models" db:"allowed_models"`
}

// KeyCreate makes a key for tenantID and returns it with its secret, the full
// key string, which is not stored and cannot be recovered. It returns
// ErrTenantNotFound.
func KeyCreate(ctx context.Context, db DB, tenantID string) (Key, string, error) {
	id, secret, full := Generate(KeyPrefix)
	k := Key{ID: id, TenantID: tenantID, Prefix: KeyPrefix + id + "_", Models: []string{}}
	err := db.QueryRow(ctx, keyInsertSQL, id, tenantID, HashSecret(secret), k.Models).Scan(&k.CreatedAt)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == pgerrcode.ForeignKeyViolation {
		return Key{}, "", ErrTenantNotFound
	}
	if err != nil {
		return Key{}, "", fmt.Errorf("credential: create: %w", err)
	}
	return k, full, nil
}

// KeyAuthenticate returns the tenant and key id of a presented key. It returns
// ErrKeyInvalid (malformed), ErrKeyUnknown, ErrKeyWrongSecret or ErrKeyRevoked (all
// wrapping ErrKeyInvalid) for anything but a valid, unrevoked key, and
// ErrTenantDisabled when the key is valid but its tenant is disabled.
func KeyAuthenticate(ctx context.Context, db DB, presented string) (tenantID, keyID string, err error) {
	c, err := KeyCheck(ctx, db, presented)
	return c.TenantID, c.KeyID, err
}

// KeyChecked is what Check learned of a presented key.
type KeyChecked struct {
	TenantID, KeyID string
	// SecretHash is the stored hash of the key's secret, set whenever a key
	// with the presented id exists (whatever the error). A limiter may keep
	// it to recognise the key's holder without a lookup while others guess
	// that key's secret. It is not secret: a leak of it reveals no key.
	SecretHash []byte
}

// KeyCheck is KeyAuthenticate, also returning the stored secret hash. The secret
// is compared before revocation is looked at, so only the holder of a
// revoked key learns that it is revoked.
func KeyCheck(ctx context.Context, db DB, presented string) (KeyChecked, error) {
	id, secret, ok := Parse(KeyPrefix, presented)
	if !ok {
		return KeyChecked{}, ErrKeyInvalid
	}
	var c KeyChecked
	var revoked, disabled bool
	err := db.QueryRow(ctx, keyAuthSQL, id).Scan(&c.TenantID, &c.SecretHash, &revoked, &disabled)
	if errors.Is(err, pgx.ErrNoRows) {
		return KeyChecked{}, ErrKeyUnknown
	}
	if err != nil {
		return KeyChecked{}, fmt.Errorf("credential: authenticate: %w", err)
	}
	c.KeyID = id
	switch {
	case !Equal(c.SecretHash, secret):
		return KeyChecked{KeyID: id, SecretHash: c.SecretHash}, ErrKeyWrongSecret
	case revoked:
		return KeyChecked{KeyID: id, SecretHash: c.SecretHash}, ErrKeyRevoked
	case disabled:
		return KeyChecked{KeyID: id, SecretHash: c.SecretHash}, ErrTenantDisabled
	}
	return c, nil
}

// KeyList returns a tenant's keys, oldest first.
func KeyList(ctx context.Context, db DB, tenantID string) ([]Key, error) {
	rows, err := db.Query(ctx, keyListSQL, tenantID)
	if err != nil {
		return nil, fmt.Errorf("credential: list: %w", err)
	}
	keys, err := pgx.CollectRows(rows, pgx.RowToStructByNameLax[Key])
	if err != nil {
		return nil, fmt.Errorf("credential: list: %w", err)
	}
	for i := range keys {
		keys[i].Prefix = KeyPrefix + keys[i].ID + "_"
	}
	return keys, nil
}

// KeyRevoke revokes one of a tenant's keys. It returns ErrKeyNotFound when the
// tenant has no such unrevoked key.
func KeyRevoke(ctx context.Context, db DB, tenantID, keyID string) error {
	tag, err := db.Exec(ctx, keyRevokeSQL, keyID, tenantID)
	if err != nil {
		return fmt.Errorf("credential: revoke: %w", err)
	}
	if tag.RowsAffected() != 1 {
		return ErrKeyNotFound
	}
	return nil
}

// KeyTouch records that a key was used now. Callers throttle it (once a
// minute per key is plenty) so the hot path does not write per request.
func KeyTouch(ctx context.Context, db DB, keyID string) error {
	if _, err := db.Exec(ctx, keyTouchSQL, keyID); err != nil {
		return fmt.Errorf("credential: touch: %w", err)
	}
	return nil
}

// Recorder makes a key change and its tenant ledger entry in one
// transaction. *account.Store is one.
type Recorder interface {
	RecordKeyEvent(ctx context.Context, p account.KeyEventParams) error
}

// KeyCreateRecorded creates a key for tenantID, limited to models (its model
// scope; empty: every model its tenant may use), and records who created
// it in the tenant's ledger, in one transaction: a key exists exactly when
// its entry does. It returns the key with its secret, a *rule.LimitError
// (field "models") or ErrTenantNotFound.
func KeyCreateRecorded(ctx context.Context, rec Recorder, tenantID string, models []string, actor string) (Key, string, error) {
	models, err := rule.NormalizeModels(models)
	if err != nil {
		return Key{}, "", err
	}
	id, secret, full := Generate(KeyPrefix)
	k := Key{ID: id, TenantID: tenantID, Prefix: KeyPrefix + id + "_", Models: models}
	var detail map[string]any
	if len(models) > 0 {
		detail = map[string]any{"models": models}
	}
	err = rec.RecordKeyEvent(ctx, account.KeyEventParams{TenantID: tenantID, Event: "created", KeyID: id, Actor: actor, Detail: detail,
		WriteFunc: func(ctx context.Context, conn *pgxpool.Conn) error {
			if err := conn.QueryRow(ctx, keyInsertSQL, id, tenantID, HashSecret(secret), models).Scan(&k.CreatedAt); err != nil {
				return fmt.Errorf("credential: create: %w", err)
			}
			return nil
		}})
	if errors.Is(err, rule.ErrTenantNotFound) {
		return Key{}, "", ErrTenantNotFound
	}
	if err != nil {
		return Key{}, "", err
	}
	return k, full, nil
}

// KeySetPriorityRecorded sets a key's priority class (critical, standard,
// sheddable) and records the change in the tenant's ledger, in one
// transaction. It returns ErrKeyNotFound (also for a revoked key, or when
// the tenant does not exist) or ErrBadPriority.
func KeySetPriorityRecorded(ctx context.Context, rec Recorder, tenantID, keyID string, priority rule.Priority, actor string) error {
	if !priority.Valid() {
		return ErrBadPriority
	}
	err := rec.RecordKeyEvent(ctx, account.KeyEventParams{TenantID: tenantID, Event: "priority " + string(priority), KeyID: keyID, Actor: actor,
		WriteFunc: func(ctx context.Context, conn *pgxpool.Conn) error {
			tag, err := conn.Exec(ctx, keySetPrioritySQL, keyID, tenantID, string(priority))
			if err != nil {
				return fmt.Errorf("credential: set priority: %w", err)
			}
			if tag.RowsAffected() != 1 {
				return ErrKeyNotFound
			}
			return nil
		}})
	if errors.Is(err, rule.ErrTenantNotFound) {
		return ErrKeyNotFound
	}
	return err
}

// KeySetModelsRecorded sets a key's model scope (exact names or '*' globs;
// empty: every model its tenant may use) and records the change, the lists
// before and after, in the tenant's ledger in one transaction, under the
// tenant's row lock that every decision on the key takes: each admission
// is checked against the list in effect when it is decided, on every
// replica. It returns a *rule.LimitError (field "models") or
// ErrKeyNotFound (also for a revoked key, or when the tenant does not
// exist).
func KeySetModelsRecorded(ctx context.Context, rec Recorder, tenantID, keyID string, models []string, actor string) ([]string, error) {
	models, err := rule.NormalizeModels(models)
	if err != nil {
		return nil, err
	}
	detail := map[string]any{"models": map[string][]string{"after": models}}
	err = rec.RecordKeyEvent(ctx, account.KeyEventParams{TenantID: tenantID, Event: "models", KeyID: keyID, Actor: actor, Detail: detail,
		WriteFunc: func(ctx context.Context, conn *pgxpool.Conn) error {
			var before []string
			err := conn.QueryRow(ctx, keySetModelsSQL, keyID, tenantID, models).Scan(&before)
			if errors.Is(err, pgx.ErrNoRows) {
				return ErrKeyNotFound
			}
			if err != nil {
				return fmt.Errorf("credential: set models: %w", err)
			}
			if before == nil {
				before = []string{}
			}
			detail["models"].(map[string][]string)["before"] = before
			return nil
		}})
	if errors.Is(err, rule.ErrTenantNotFound) {
		return nil, ErrKeyNotFound
	}
	return models, err
}

// ErrBadPriority: a priority class other than critical, standard or
// sheddable.
var ErrBadPriority = errors.New("credential: priority must be critical, standard or sheddable")

// KeyRevokeRecorded revokes a key and records who revoked it in the tenant's
// ledger, in one transaction. It returns ErrKeyNotFound (also when the tenant
// does not exist).
func KeyRevokeRecorded(ctx context.Context, rec Recorder, tenantID, keyID, actor string) error {
	err := rec.RecordKeyEvent(ctx, account.KeyEventParams{TenantID: tenantID, Event: "revoked", KeyID: keyID, Actor: actor,
		WriteFunc: func(ctx context.Context, conn *pgxpool.Conn) error { return KeyRevoke(ctx, conn, tenantID, keyID) }})
	if errors.Is(err, rule.ErrTenantNotFound) {
		return ErrKeyNotFound
	}
	return err
}
