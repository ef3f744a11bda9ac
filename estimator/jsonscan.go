// Generic JSON helpers, independent of the request shapes: exact integer
// reading, field paths, and locating errors in a malformed body.

package estimator

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode/utf8"
)

// parseInteger reads a JSON number exactly. isInt is false when the value
// has a fractional part (1.5, 1e-3); 2.0 and 1e3 are integers. big is set
// when the magnitude exceeds 10^18, in which case x only carries the sign.
func parseInteger(s string) (x int64, isInt, big bool) {
	neg := strings.HasPrefix(s, "-")
	if neg {
		s = s[1:]
	}
	mant, exp := s, ""
	if i := strings.IndexAny(s, "eE"); i >= 0 {
		mant, exp = s[:i], s[i+1:]
	}
	intPart, frac := mant, ""
	if i := strings.IndexByte(mant, '.'); i >= 0 {
		intPart, frac = mant[:i], mant[i+1:]
	}
	// The value is digits * 10^e10.
	digits := strings.TrimLeft(intPart+frac, "0")
	e10 := int64(0)
	if exp != "" {
		sign := int64(1)
		switch exp[0] {
		case '-':
			sign, exp = -1, exp[1:]
		case '+':
			exp = exp[1:]
		}
		for i := 0; i < len(exp); i++ {
			if e10 < 1_000_000 {
				e10 = e10*10 + int64(exp[i]-'0')
			}
		}
		e10 *= sign
	}
	e10 -= int64(len(frac))
	if digits == "" {
		return 0, true, false
	}
	for e10 < 0 && strings.HasSuffix(digits, "0") {
		digits = digits[:len(digits)-1]
		e10++
	}
	if e10 < 0 {
		return 0, false, false
	}
	sign := int64(1)
	if neg {
		sign = -1
	}
	if int64(len(digits))+e10 > 18 {
		return sign, true, true
	}
	v, err := strconv.ParseInt(digits, 10, 64)
	if err != nil {
		return sign, true, true
	}
	for ; e10 > 0; e10-- {
		v *= 10
	}
	return sign * v, true, false
}

func index(path string, i int) string {
	return path + "[" + strconv.Itoa(i) + "]"
}

func kind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case string:
		return "a string"
	case json.Number:
		return "a number"
	case bool:
		return "a boolean"
	case []any:
		return "an array"
	default:
		return "a " + fmt.Sprintf("%T", v)
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// syntaxError turns a decoding error into an InvalidError for "body".
func syntaxError(body []byte, err error) *InvalidError {
	var se *json.SyntaxError
	switch {
	case errors.As(err, &se):
		return invalid("body", fmt.Sprintf("invalid JSON at byte offset %d: %s", se.Offset, se.Error()))
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return invalid("body", fmt.Sprintf("invalid JSON at byte offset %d: unexpected end of input", len(body)))
	default:
		return invalid("body", "invalid JSON: "+err.Error())
	}
}

// invalidUTF8 locates the first invalid UTF-8 byte of body and names the
// JSON string holding it. encoding/json would silently replace it with
// U+FFFD, changing what is counted.
func invalidUTF8(body []byte) *InvalidError {
	bad := 0
	for bad < len(body) {
		r, sz := utf8.DecodeRune(body[bad:])
		if r == utf8.RuneError && sz <= 1 {
			break
		}
		bad += sz
	}
	if path := stringPathAt(body, bad); path != "" && len(path) <= maxPathBytes {
		return invalid(path, fmt.Sprintf("contains invalid UTF-8 (byte offset %d)", bad))
	}
	return invalid("body", fmt.Sprintf("invalid UTF-8 at byte offset %d", bad))
}

// maxPathBytes bounds the field path reported for invalid UTF-8; a longer
// path (deep nesting, long keys) is reported as "body".
const maxPathBytes = 256

// stringPathAt walks body's tokens and returns the JSON path of the string
// that contains byte offset off (for an object key, the path of its
// object), or "" when no string does.
func stringPathAt(body []byte, off int) string {
	type frame struct {
		obj     bool
		key     string
		idx     int
		wantKey bool
	}
	var stack []frame
	path := func(withKey bool) string {
		var b strings.Builder
		for i, f := range stack {
			if !f.obj {
				b.WriteString("[" + strconv.Itoa(f.idx) + "]")
				continue
			}
			if i == len(stack)-1 && !withKey {
				break
			}
			if b.Len() > 0 {
				b.WriteByte('.')
			}
			b.WriteString(f.key)
		}
		return b.String()
	}
	advance := func() {
		if len(stack) == 0 {
			return
		}
		top := &stack[len(stack)-1]
		if top.obj {
			top.wantKey = true
		} else {
			top.idx++
		}
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	prev := 0
	for {
		tok, err := dec.Token()
		if err != nil {
			return ""
		}
		cur := int(dec.InputOffset())
		inside := off >= prev && off < cur
		switch t := tok.(type) {
		case json.Delim:
			switch t {
			case '{', '[':
				if len(stack) >= maxPathBytes/2 {
					return "" // too deep for a useful path
				}
				stack = append(stack, frame{obj: t == '{', wantKey: t == '{'})
			default:
				stack = stack[:len(stack)-1]
				advance()
			}
		case string:
			if n := len(stack); n > 0 && stack[n-1].obj && stack[n-1].wantKey {
				if inside {
					p := path(false)
					if p == "" {
						p = "body"
					}
					return p
				}
				stack[n-1].key = t
				stack[n-1].wantKey = false
				break
			}
			if inside {
				return path(true)
			}
			advance()
		default:
			advance()
		}
		prev = cur
	}
}
