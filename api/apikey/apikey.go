// Package apikey owns tenant API keys: their format, their hashed storage
// and their verification.
//
// A key reads tg_<id>_<secret>. The id (12 characters) is stored in clear
// and shown in listings; the secret (52 characters, 256 random bits) is
// shown once, at creation, and only its SHA-256 is stored. Verification
// looks the id up and compares hashes in constant time, so neither timing
// nor a database leak reveals a usable key.
package apikey

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	_ "embed"
	"encoding/base32"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tokengate/tokengate/budget"
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
	//go:embed sql/key_touch.sql
	keyTouchSQL string
)

// Prefix starts every tenant key, so that scanners can spot leaked keys.
const Prefix = "tg_"

const (
	idLen     = 12
	secretLen = 52
)

// Errors.
var (
	// ErrInvalid: the presented key is malformed, unknown, wrong or revoked.
	// Callers must not tell these apart to the client; the errors below
	// wrap it so that a limiter can (only guesses should spend).
	ErrInvalid = errors.New("apikey: invalid key")
	// ErrUnknownKey wraps ErrInvalid: well formed, but no key has that id.
	ErrUnknownKey = fmt.Errorf("%w: no key has that id", ErrInvalid)
	// ErrWrongSecret wraps ErrInvalid: the id exists, the secret is wrong.
	ErrWrongSecret = fmt.Errorf("%w: wrong secret", ErrInvalid)
	// ErrRevoked wraps ErrInvalid: the right secret of a revoked key.
	ErrRevoked = fmt.Errorf("%w: revoked", ErrInvalid)
	// ErrTenantDisabled: the key is valid but its tenant is disabled.
	ErrTenantDisabled = errors.New("apikey: tenant disabled")
	// ErrNotFound: no such key for that tenant.
	ErrNotFound = errors.New("apikey: key not found")
	// ErrTenantNotFound: Create named a tenant that does not exist.
	ErrTenantNotFound = errors.New("apikey: tenant not found")
)

// DB is what the key functions need: a pool, a connection or a transaction.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

var encoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// Key describes a stored key; it never holds the secret.
type Key struct {
	ID         string     `json:"id"`
	TenantID   string     `json:"tenant_id"`
	Prefix     string     `json:"prefix"` // tg_<id>_, how the key starts
	CreatedAt  time.Time  `json:"created_at"`
	LastUsedAt *time.Time `json:"last_used_at"`
	RevokedAt  *time.Time `json:"revoked_at"`
}

func randomString(n int) string {
	b := make([]byte, (n*5+7)/8)
	_, _ = rand.Read(b)
	return encoding.EncodeToString(b)[:n]
}

// Generate returns a new credential of the form <prefix><id>_<secret>: a
// 12-character id stored in clear and a 52-character (256-bit) secret of
// which only HashSecret is stored. Admin tokens share the format.
func Generate(prefix string) (id, secret, full string) {
	id, secret = randomString(idLen), randomString(secretLen)
	return id, secret, prefix + id + "_" + secret
}

// HashSecret is what is stored of a secret.
func HashSecret(secret string) []byte {
	sum := sha256.Sum256([]byte(secret))
	return sum[:]
}

// Equal compares a stored hash with a presented secret in constant time.
func Equal(stored []byte, secret string) bool {
	return subtle.ConstantTimeCompare(stored, HashSecret(secret)) == 1
}

// Create makes a key for tenantID and returns it with its secret, the full
// key string, which is not stored and cannot be recovered. It returns
// ErrTenantNotFound.
func Create(ctx context.Context, db DB, tenantID string) (Key, string, error) {
	id, secret, full := Generate(Prefix)
	k := Key{ID: id, TenantID: tenantID, Prefix: Prefix + id + "_"}
	err := db.QueryRow(ctx, keyInsertSQL, id, tenantID, HashSecret(secret)).Scan(&k.CreatedAt)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23503" { // foreign_key_violation
		return Key{}, "", ErrTenantNotFound
	}
	if err != nil {
		return Key{}, "", fmt.Errorf("apikey: create: %w", err)
	}
	return k, full, nil
}

// Parse splits a presented credential of the Generate format into id and
// secret, checking its shape without touching the database.
func Parse(prefix, presented string) (id, secret string, ok bool) {
	rest, found := strings.CutPrefix(presented, prefix)
	if !found || len(rest) != idLen+1+secretLen || rest[idLen] != '_' {
		return "", "", false
	}
	id, secret = rest[:idLen], rest[idLen+1:]
	for _, s := range []string{id, secret} {
		for i := 0; i < len(s); i++ {
			c := s[i]
			if !(c >= 'a' && c <= 'z' || c >= '2' && c <= '7') {
				return "", "", false
			}
		}
	}
	return id, secret, true
}

// Authenticate returns the tenant and key id of a presented key. It returns
// ErrInvalid (malformed), ErrUnknownKey, ErrWrongSecret or ErrRevoked (all
// wrapping ErrInvalid) for anything but a valid, unrevoked key, and
// ErrTenantDisabled when the key is valid but its tenant is disabled.
func Authenticate(ctx context.Context, db DB, presented string) (tenantID, keyID string, err error) {
	c, err := Check(ctx, db, presented)
	return c.TenantID, c.KeyID, err
}

// Checked is what Check learned of a presented key.
type Checked struct {
	TenantID, KeyID string
	// SecretHash is the stored hash of the key's secret, set whenever a key
	// with the presented id exists (whatever the error). A limiter may keep
	// it to recognise the key's holder without a lookup while others guess
	// that key's secret. It is not secret: a leak of it reveals no key.
	SecretHash []byte
}

// Check is Authenticate, also returning the stored secret hash. The secret
// is compared before revocation is looked at, so only the holder of a
// revoked key learns that it is revoked.
func Check(ctx context.Context, db DB, presented string) (Checked, error) {
	id, secret, ok := Parse(Prefix, presented)
	if !ok {
		return Checked{}, ErrInvalid
	}
	var c Checked
	var revoked, disabled bool
	err := db.QueryRow(ctx, keyAuthSQL, id).Scan(&c.TenantID, &c.SecretHash, &revoked, &disabled)
	if errors.Is(err, pgx.ErrNoRows) {
		return Checked{}, ErrUnknownKey
	}
	if err != nil {
		return Checked{}, fmt.Errorf("apikey: authenticate: %w", err)
	}
	c.KeyID = id
	switch {
	case !Equal(c.SecretHash, secret):
		return Checked{KeyID: id, SecretHash: c.SecretHash}, ErrWrongSecret
	case revoked:
		return Checked{KeyID: id, SecretHash: c.SecretHash}, ErrRevoked
	case disabled:
		return Checked{KeyID: id, SecretHash: c.SecretHash}, ErrTenantDisabled
	}
	return c, nil
}

// List returns a tenant's keys, oldest first.
func List(ctx context.Context, db DB, tenantID string) ([]Key, error) {
	rows, err := db.Query(ctx, keyListSQL, tenantID)
	if err != nil {
		return nil, fmt.Errorf("apikey: list: %w", err)
	}
	keys, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Key, error) {
		var k Key
		err := r.Scan(&k.ID, &k.TenantID, &k.CreatedAt, &k.LastUsedAt, &k.RevokedAt)
		k.Prefix = Prefix + k.ID + "_"
		return k, err
	})
	if err != nil {
		return nil, fmt.Errorf("apikey: list: %w", err)
	}
	return keys, nil
}

// Revoke revokes one of a tenant's keys. It returns ErrNotFound when the
// tenant has no such unrevoked key.
func Revoke(ctx context.Context, db DB, tenantID, keyID string) error {
	tag, err := db.Exec(ctx, keyRevokeSQL, keyID, tenantID)
	if err != nil {
		return fmt.Errorf("apikey: revoke: %w", err)
	}
	if tag.RowsAffected() != 1 {
		return ErrNotFound
	}
	return nil
}

// Touch records that a key was used now. Callers throttle it (once a
// minute per key is plenty) so the hot path does not write per request.
func Touch(ctx context.Context, db DB, keyID string) error {
	if _, err := db.Exec(ctx, keyTouchSQL, keyID); err != nil {
		return fmt.Errorf("apikey: touch: %w", err)
	}
	return nil
}

// Recorder makes a key change and its tenant ledger entry in one
// transaction. *budget.Store is one.
type Recorder interface {
	RecordKeyEvent(ctx context.Context, p budget.KeyEventParams) error
}

// CreateRecorded creates a key for tenantID and records who created it in
// the tenant's ledger, in one transaction: a key exists exactly when its
// entry does. It returns the key with its secret, or ErrTenantNotFound.
func CreateRecorded(ctx context.Context, rec Recorder, tenantID, actor string) (Key, string, error) {
	id, secret, full := Generate(Prefix)
	k := Key{ID: id, TenantID: tenantID, Prefix: Prefix + id + "_"}
	err := rec.RecordKeyEvent(ctx, budget.KeyEventParams{TenantID: tenantID, Event: "created", KeyID: id, Actor: actor,
		WriteFunc: func(ctx context.Context, conn *pgxpool.Conn) error {
			if err := conn.QueryRow(ctx, keyInsertSQL, id, tenantID, HashSecret(secret)).Scan(&k.CreatedAt); err != nil {
				return fmt.Errorf("apikey: create: %w", err)
			}
			return nil
		}})
	if errors.Is(err, budget.ErrTenantNotFound) {
		return Key{}, "", ErrTenantNotFound
	}
	if err != nil {
		return Key{}, "", err
	}
	return k, full, nil
}

// RevokeRecorded revokes a key and records who revoked it in the tenant's
// ledger, in one transaction. It returns ErrNotFound (also when the tenant
// does not exist).
func RevokeRecorded(ctx context.Context, rec Recorder, tenantID, keyID, actor string) error {
	err := rec.RecordKeyEvent(ctx, budget.KeyEventParams{TenantID: tenantID, Event: "revoked", KeyID: keyID, Actor: actor,
		WriteFunc: func(ctx context.Context, conn *pgxpool.Conn) error { return Revoke(ctx, conn, tenantID, keyID) }})
	if errors.Is(err, budget.ErrTenantNotFound) {
		return ErrNotFound
	}
	return err
}
