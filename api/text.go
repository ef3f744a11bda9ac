package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"unicode/utf8"

	"github.com/labstack/echo/v5"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
)

// What a request may send as text. Postgres text cannot hold a NUL byte
// (SQLSTATE 22021), and a value the store refuses must be the caller's 400
// naming the field, never a 500. So every text the API may store is checked
// at the edge: path parameters and query values (requireText), and every
// string of an admin body (readTextBody). An admission body is parsed by the
// estimator, which refuses a NUL in the model name (stored with the
// admission); its message content is only counted, never stored, and may
// hold any JSON string, NUL included, as it may for the provider.

// requireText refuses a request whose path parameters or query values (or
// query names) cannot be stored as text, with a 400 naming the parameter.
func (s *Server) requireText(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c *echo.Context) error {
		if err := checkRequestText(c); err != nil {
			return err
		}
		return next(c)
	}
}

func checkRequestText(c *echo.Context) error {
	for _, p := range c.PathValues() {
		if why := rule.TextProblem(p.Value); why != "" {
			return invalid(p.Name, why)
		}
	}
	// What does not parse is dropped by the handlers' own reading, as
	// before; what parses is what they may use.
	q, _ := url.ParseQuery(c.Request().URL.RawQuery)
	names := make([]string, 0, len(q))
	for k := range q {
		names = append(names, k)
	}
	slices.Sort(names)
	for _, k := range names {
		if why := rule.TextProblem(k); why != "" {
			return invalid("query", "a parameter name "+why)
		}
		for _, v := range q[k] {
			if why := rule.TextProblem(v); why != "" {
				return invalid(k, why)
			}
		}
	}
	return nil
}

// readTextBody reads an admin body whose every string is stored: it must be
// UTF-8, and no string (nor object key) may hold a NUL. A body that is not
// JSON is left to the decoder to refuse.
func readTextBody(c *echo.Context) ([]byte, error) {
	body, err := readBody(c)
	if err != nil {
		return nil, err
	}
	if !utf8.Valid(body) {
		return nil, invalid("body", "must be valid UTF-8")
	}
	if bytes.IndexByte(body, '\\') < 0 {
		return body, nil // no escape, so no NUL (a raw one is not JSON)
	}
	var v any
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if dec.Decode(&v) != nil {
		return body, nil
	}
	if field, why := jsonTextProblem("", v); why != "" {
		return nil, invalid(field, why)
	}
	return body, nil
}

// jsonTextProblem finds the first string of v (in key order) that cannot be
// stored, and its path: "reason", "models[2]", "limits.period".
func jsonTextProblem(path string, v any) (string, string) {
	switch x := v.(type) {
	case string:
		if why := rule.TextProblem(x); why != "" {
			return orBody(path), why
		}
	case []any:
		for i, e := range x {
			if f, why := jsonTextProblem(path+"["+strconv.Itoa(i)+"]", e); why != "" {
				return f, why
			}
		}
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			if why := rule.TextProblem(k); why != "" {
				return orBody(path), "a field name " + why
			}
			sub := k
			if path != "" {
				sub = path + "." + k
			}
			if f, why := jsonTextProblem(sub, x[k]); why != "" {
				return f, why
			}
		}
	}
	return "", ""
}

func orBody(path string) string {
	if path == "" {
		return "body"
	}
	return path
}

// bodyReadError is the answer to a body that could not be read: 413 past
// the body limit (whether the body declared its length or came chunked),
// 408 past the body read deadline, else 400.
func bodyReadError(err error) error {
	var mb *http.MaxBytesError
	switch {
	case echo.StatusCode(err) == http.StatusRequestEntityTooLarge, errors.As(err, &mb):
		return echo.ErrStatusRequestEntityTooLarge
	case IsBodyTimeout(err):
		return &Error{Status: http.StatusRequestTimeout, Type: "request_timeout", Field: "body",
			Message: "the request body did not arrive within the server's body read timeout"}
	}
	return invalid("body", "could not read the request body")
}

// storeRefused is the answer to a value Postgres refused (a NUL byte that
// slipped past the edge, a character the encoding cannot hold, a string
// longer than its column): the caller's 400, not an outage.
func storeRefused(err error) *Error {
	if !account.IsInvalidInput(err) {
		return nil
	}
	return invalid("", "a text value of the request cannot be stored (a NUL character, a character outside UTF-8, or too long)")
}
