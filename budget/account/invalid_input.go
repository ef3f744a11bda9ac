package account

import (
	"errors"

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
