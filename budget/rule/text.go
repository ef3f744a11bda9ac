package rule

import (
	"strings"
	"unicode/utf8"
)

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
