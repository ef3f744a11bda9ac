package web

import "strings"

// modelList reads a model scope as a form gives it: names or globs
// separated by commas or white space ("" for every model).
func modelList(s string) []string {
	return strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' || r == '\n' || r == '\r' || r == '\t' })
}
