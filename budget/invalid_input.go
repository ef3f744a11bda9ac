package budget

import (
	"errors"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"
)

// IsInvalidInput reports whether err is Postgres refusing a value the
// caller sent: a NUL byte or a character the database's encoding cannot
// hold (SQLSTATE 22021 character_not_in_repertoire, 22P05
// untranslatable_character), or a string longer than its column (22001
// string_data_right_truncation). The faces validate text at the edge, so
// this is the backstop for what slips through: such an error is the
// client's (a 400, gRPC INVALID_ARGUMENT), never an outage, and it is not
// logged as a server error. classify already keeps it out of
// ErrUnavailable, so no failure policy applies to it.
func IsInvalidInput(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.Code {
	case pgerrcode.CharacterNotInRepertoire, pgerrcode.UntranslatableCharacter, pgerrcode.StringDataRightTruncationDataException:
		return true
	}
	return false
}

// TextProblem says why s cannot be stored as Postgres text (a NUL, or not
// UTF-8), or "" if it can. Every face checks its text inputs with it at the
// edge, so that the caller gets a 4xx naming the field and the store never
// sees the value; IsInvalidInput is the backstop behind it.
func TextProblem(s string) string {
	switch {
	case strings.IndexByte(s, 0) >= 0:
		return `must not contain a NUL character (\u0000)`
	case !utf8.ValidString(s):
		return "must be valid UTF-8"
	}
	return ""
}
