package credential

// The credentials of administrators: admin tokens
// (tga_<id>_<secret>, stored as SHA-256 like tenant keys) for the admin API
// and the CLI, and the dashboard's sessions, which every replica shares.
//
// A session is created by logging in with a token. Its cookie holds a random
// secret of which only the hash is stored, and each session has its own CSRF
// token, so that logging out (or revoking the token) makes both the cookie
// and every form rendered for it useless.

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

var (
	//go:embed sql/token_insert.sql
	tokenInsertSQL string
	//go:embed sql/token_auth.sql
	tokenAuthSQL string
	//go:embed sql/token_list.sql
	tokenListSQL string
	//go:embed sql/token_revoke.sql
	tokenRevokeSQL string
	//go:embed sql/token_touch.sql
	tokenTouchSQL string
	//go:embed sql/session_insert.sql
	sessionInsertSQL string
	//go:embed sql/session_get.sql
	sessionGetSQL string
	//go:embed sql/session_delete.sql
	sessionDeleteSQL string
	//go:embed sql/session_delete_token.sql
	sessionDeleteTokenSQL string
)

// AdminPrefix starts every admin token; tenant keys start with tg_, so neither
// can be mistaken for the other.
const AdminPrefix = "tga_"

// Errors.
var (
	// ErrAdminInvalid: the token or session is malformed, unknown, wrong,
	// expired or revoked.
	ErrAdminInvalid = errors.New("credential: invalid credential")
	// ErrAdminNotFound: no such unrevoked token.
	ErrAdminNotFound = errors.New("credential: not found")
	// ErrAdminNameTaken: an unrevoked token already has that name.
	ErrAdminNameTaken = errors.New("credential: name taken")
	// ErrAdminBadName: names are 1 to 64 printable characters.
	ErrAdminBadName = errors.New("credential: name must be 1 to 64 printable characters")
)

// AdminToken describes an admin token; it never holds the secret. Its Name is
// the actor recorded in the ledger for the admin's changes.
type AdminToken struct {
	ID         string     `json:"id" db:"id"`
	Name       string     `json:"name" db:"name"`
	CreatedAt  time.Time  `json:"created_at" db:"created_at"`
	LastUsedAt *time.Time `json:"last_used_at" db:"last_used_at"`
	RevokedAt  *time.Time `json:"revoked_at" db:"revoked_at"`
}

func validName(name string) bool {
	if name == "" || len(name) > 64 {
		return false
	}
	for _, r := range name {
		if r < 0x20 || r == 0x7f {
			return false
		}
	}
	return true
}

// AdminTokenCreate makes a token and returns it with its secret (the full token),
// which is not stored and cannot be recovered. It returns ErrAdminBadName or
// ErrAdminNameTaken.
func AdminTokenCreate(ctx context.Context, db DB, name string) (AdminToken, string, error) {
	name = strings.TrimSpace(name)
	if !validName(name) {
		return AdminToken{}, "", ErrAdminBadName
	}
	id, secret, full := Generate(AdminPrefix)
	t := AdminToken{ID: id, Name: name}
	err := db.QueryRow(ctx, tokenInsertSQL, id, name, HashSecret(secret)).Scan(&t.CreatedAt)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == pgerrcode.UniqueViolation {
		return AdminToken{}, "", ErrAdminNameTaken
	}
	if err != nil {
		return AdminToken{}, "", fmt.Errorf("credential: create: %w", err)
	}
	return t, full, nil
}

// AdminTokenAuthenticate returns the token a presented secret belongs to. It returns
// ErrAdminInvalid for anything but a valid, unrevoked admin token.
func AdminTokenAuthenticate(ctx context.Context, db DB, presented string) (AdminToken, error) {
	id, secret, ok := Parse(AdminPrefix, presented)
	if !ok {
		return AdminToken{}, ErrAdminInvalid
	}
	var t AdminToken
	var stored []byte
	var revoked bool
	err := db.QueryRow(ctx, tokenAuthSQL, id).Scan(&t.ID, &t.Name, &stored, &revoked)
	if errors.Is(err, pgx.ErrNoRows) {
		return AdminToken{}, ErrAdminInvalid
	}
	if err != nil {
		return AdminToken{}, fmt.Errorf("credential: authenticate: %w", err)
	}
	if !Equal(stored, secret) || revoked {
		return AdminToken{}, ErrAdminInvalid
	}
	return t, nil
}

// AdminTokenList returns every token, revoked ones included, oldest first.
func AdminTokenList(ctx context.Context, db DB) ([]AdminToken, error) {
	rows, err := db.Query(ctx, tokenListSQL)
	if err != nil {
		return nil, fmt.Errorf("credential: list: %w", err)
	}
	tokens, err := pgx.CollectRows(rows, pgx.RowToStructByName[AdminToken])
	if err != nil {
		return nil, fmt.Errorf("credential: list: %w", err)
	}
	return tokens, nil
}

// AdminTokenRevoke revokes a token and ends its sessions. It returns ErrAdminNotFound when
// there is no such unrevoked token. (A session's lookup also checks that its
// token is not revoked, so no session outlives the revocation.)
func AdminTokenRevoke(ctx context.Context, db DB, id string) error {
	tag, err := db.Exec(ctx, tokenRevokeSQL, id)
	if err != nil {
		return fmt.Errorf("credential: revoke: %w", err)
	}
	if tag.RowsAffected() != 1 {
		return ErrAdminNotFound
	}
	if _, err := db.Exec(ctx, sessionDeleteTokenSQL, id); err != nil {
		return fmt.Errorf("credential: end sessions: %w", err)
	}
	return nil
}

// AdminTokenTouch records that a token was used now; callers throttle it.
func AdminTokenTouch(ctx context.Context, db DB, id string) error {
	if _, err := db.Exec(ctx, tokenTouchSQL, id); err != nil {
		return fmt.Errorf("credential: touch: %w", err)
	}
	return nil
}

// Session is a logged-in dashboard session.
type Session struct {
	TokenID   string
	TokenName string
	CSRF      string
	ExpiresAt time.Time
}

func random(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// SessionCreate starts a session for a token and returns the cookie value
// (shown to the browser only) and the session.
func SessionCreate(ctx context.Context, db DB, t AdminToken, ttl time.Duration) (string, Session, error) {
	// Logging in also purges expired sessions (and the no-op cookie hash
	// below matches nothing), so they do not pile up.
	if _, err := db.Exec(ctx, sessionDeleteSQL, []byte{}); err != nil {
		return "", Session{}, fmt.Errorf("credential: purge sessions: %w", err)
	}
	cookie := random(32)
	s := Session{TokenID: t.ID, TokenName: t.Name, CSRF: random(32)}
	err := db.QueryRow(ctx, sessionInsertSQL, HashSecret(cookie), t.ID, s.CSRF, ttl.Seconds()).Scan(&s.ExpiresAt)
	if err != nil {
		return "", Session{}, fmt.Errorf("credential: session: %w", err)
	}
	return cookie, s, nil
}

// SessionGet returns the live session of a cookie value. It returns
// ErrAdminInvalid when the session is unknown, expired, logged out, or its token
// was revoked.
func SessionGet(ctx context.Context, db DB, cookie string) (Session, error) {
	if cookie == "" || len(cookie) > 128 {
		return Session{}, ErrAdminInvalid
	}
	var s Session
	err := db.QueryRow(ctx, sessionGetSQL, HashSecret(cookie)).Scan(&s.TokenID, &s.TokenName, &s.CSRF, &s.ExpiresAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return Session{}, ErrAdminInvalid
	}
	if err != nil {
		return Session{}, fmt.Errorf("credential: session: %w", err)
	}
	return s, nil
}

// SessionDelete ends a session (logout), and purges expired ones.
func SessionDelete(ctx context.Context, db DB, cookie string) error {
	if _, err := db.Exec(ctx, sessionDeleteSQL, HashSecret(cookie)); err != nil {
		return fmt.Errorf("credential: logout: %w", err)
	}
	return nil
}
