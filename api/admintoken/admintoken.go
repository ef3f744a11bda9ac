// Package admintoken owns the credentials of administrators: admin tokens
// (tga_<id>_<secret>, stored as SHA-256 like tenant keys) for the admin API
// and the CLI, and the dashboard's sessions, which every replica shares.
//
// A session is created by logging in with a token. Its cookie holds a random
// secret of which only the hash is stored, and each session has its own CSRF
// token, so that logging out (or revoking the token) makes both the cookie
// and every form rendered for it useless.
package admintoken

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tokengate/tokengate/api/apikey"
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

// Prefix starts every admin token; tenant keys start with tg_, so neither
// can be mistaken for the other.
const Prefix = "tga_"

// Errors.
var (
	// ErrInvalid: the token or session is malformed, unknown, wrong,
	// expired or revoked.
	ErrInvalid = errors.New("admintoken: invalid credential")
	// ErrNotFound: no such unrevoked token.
	ErrNotFound = errors.New("admintoken: not found")
	// ErrNameTaken: an unrevoked token already has that name.
	ErrNameTaken = errors.New("admintoken: name taken")
	// ErrBadName: names are 1 to 64 printable characters.
	ErrBadName = errors.New("admintoken: name must be 1 to 64 printable characters")
)

// DB is what the functions need: a pool, a connection or a transaction.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Token describes an admin token; it never holds the secret. Its Name is
// the actor recorded in the ledger for the admin's changes.
type Token struct {
	ID         string     `json:"id"`
	Name       string     `json:"name"`
	CreatedAt  time.Time  `json:"created_at"`
	LastUsedAt *time.Time `json:"last_used_at"`
	RevokedAt  *time.Time `json:"revoked_at"`
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

// Create makes a token and returns it with its secret (the full token),
// which is not stored and cannot be recovered. It returns ErrBadName or
// ErrNameTaken.
func Create(ctx context.Context, db DB, name string) (Token, string, error) {
	name = strings.TrimSpace(name)
	if !validName(name) {
		return Token{}, "", ErrBadName
	}
	id, secret, full := apikey.Generate(Prefix)
	t := Token{ID: id, Name: name}
	err := db.QueryRow(ctx, tokenInsertSQL, id, name, apikey.HashSecret(secret)).Scan(&t.CreatedAt)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" {
		return Token{}, "", ErrNameTaken
	}
	if err != nil {
		return Token{}, "", fmt.Errorf("admintoken: create: %w", err)
	}
	return t, full, nil
}

// Authenticate returns the token a presented secret belongs to. It returns
// ErrInvalid for anything but a valid, unrevoked admin token.
func Authenticate(ctx context.Context, db DB, presented string) (Token, error) {
	id, secret, ok := apikey.Parse(Prefix, presented)
	if !ok {
		return Token{}, ErrInvalid
	}
	var t Token
	var stored []byte
	var revoked bool
	err := db.QueryRow(ctx, tokenAuthSQL, id).Scan(&t.ID, &t.Name, &stored, &revoked)
	if errors.Is(err, pgx.ErrNoRows) {
		return Token{}, ErrInvalid
	}
	if err != nil {
		return Token{}, fmt.Errorf("admintoken: authenticate: %w", err)
	}
	if !apikey.Equal(stored, secret) || revoked {
		return Token{}, ErrInvalid
	}
	return t, nil
}

// List returns every token, revoked ones included, oldest first.
func List(ctx context.Context, db DB) ([]Token, error) {
	rows, err := db.Query(ctx, tokenListSQL)
	if err != nil {
		return nil, fmt.Errorf("admintoken: list: %w", err)
	}
	tokens, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Token, error) {
		var t Token
		err := r.Scan(&t.ID, &t.Name, &t.CreatedAt, &t.LastUsedAt, &t.RevokedAt)
		return t, err
	})
	if err != nil {
		return nil, fmt.Errorf("admintoken: list: %w", err)
	}
	return tokens, nil
}

// Revoke revokes a token and ends its sessions. It returns ErrNotFound when
// there is no such unrevoked token. (A session's lookup also checks that its
// token is not revoked, so no session outlives the revocation.)
func Revoke(ctx context.Context, db DB, id string) error {
	tag, err := db.Exec(ctx, tokenRevokeSQL, id)
	if err != nil {
		return fmt.Errorf("admintoken: revoke: %w", err)
	}
	if tag.RowsAffected() != 1 {
		return ErrNotFound
	}
	if _, err := db.Exec(ctx, sessionDeleteTokenSQL, id); err != nil {
		return fmt.Errorf("admintoken: end sessions: %w", err)
	}
	return nil
}

// Touch records that a token was used now; callers throttle it.
func Touch(ctx context.Context, db DB, id string) error {
	if _, err := db.Exec(ctx, tokenTouchSQL, id); err != nil {
		return fmt.Errorf("admintoken: touch: %w", err)
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
func SessionCreate(ctx context.Context, db DB, t Token, ttl time.Duration) (string, Session, error) {
	// Logging in also purges expired sessions (and the no-op cookie hash
	// below matches nothing), so they do not pile up.
	if _, err := db.Exec(ctx, sessionDeleteSQL, []byte{}); err != nil {
		return "", Session{}, fmt.Errorf("admintoken: purge sessions: %w", err)
	}
	cookie := random(32)
	s := Session{TokenID: t.ID, TokenName: t.Name, CSRF: random(32)}
	err := db.QueryRow(ctx, sessionInsertSQL, apikey.HashSecret(cookie), t.ID, s.CSRF, ttl.Seconds()).Scan(&s.ExpiresAt)
	if err != nil {
		return "", Session{}, fmt.Errorf("admintoken: session: %w", err)
	}
	return cookie, s, nil
}

// SessionGet returns the live session of a cookie value. It returns
// ErrInvalid when the session is unknown, expired, logged out, or its token
// was revoked.
func SessionGet(ctx context.Context, db DB, cookie string) (Session, error) {
	if cookie == "" || len(cookie) > 128 {
		return Session{}, ErrInvalid
	}
	var s Session
	err := db.QueryRow(ctx, sessionGetSQL, apikey.HashSecret(cookie)).Scan(&s.TokenID, &s.TokenName, &s.CSRF, &s.ExpiresAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return Session{}, ErrInvalid
	}
	if err != nil {
		return Session{}, fmt.Errorf("admintoken: session: %w", err)
	}
	return s, nil
}

// SessionDelete ends a session (logout), and purges expired ones.
func SessionDelete(ctx context.Context, db DB, cookie string) error {
	if _, err := db.Exec(ctx, sessionDeleteSQL, apikey.HashSecret(cookie)); err != nil {
		return fmt.Errorf("admintoken: logout: %w", err)
	}
	return nil
}
