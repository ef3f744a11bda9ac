package credential

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base32"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

const (
	idLen     = 12
	secretLen = 52
)

// DB is what the credential functions need: a pool, a connection or a
// transaction.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

var encoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

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
