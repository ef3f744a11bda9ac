package api

import (
	"encoding/json"
	"strconv"
	"time"
)

// appendJSON appends a as encoding/json's Encoder writes it (its escaping
// of HTML characters, its trailing newline), by hand. The admission's
// answer is the HTTP face's busiest, and encoding it by reflection cost 5 %
// of the server's CPU under the bench's load (BENCHMARKS.md, "eighth
// step"). It reports false, and appends nothing, for what only
// encoding/json decides (a time outside years 0-9999): the caller then
// encodes a with it. TestAdmittedJSONAsEncodingJSON holds the two equal.
func (a admittedJSON) appendJSON(b []byte) ([]byte, bool) {
	if !rfc3339Year(a.CreatedAt) || !rfc3339Year(a.ExpiresAt) {
		return b, false
	}
	b = append(b, `{"id":`...)
	b = appendJSONString(b, a.ID)
	b = append(b, `,"admitted":`...)
	b = strconv.AppendBool(b, a.Admitted)
	b = append(b, `,"model":`...)
	b = appendJSONString(b, a.Model)
	b = append(b, `,"estimate":{"input_tokens":`...)
	b = strconv.AppendInt(b, a.Estimate.InputTokens, 10)
	b = append(b, `,"output_tokens":`...)
	b = strconv.AppendInt(b, a.Estimate.OutputTokens, 10)
	b = append(b, `,"cost":`...)
	b = strconv.AppendInt(b, a.Estimate.Cost, 10)
	b = append(b, `,"approximate":`...)
	b = strconv.AppendBool(b, a.Estimate.Approximate)
	b = append(b, `},"created_at":"`...)
	b = a.CreatedAt.AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","expires_at":"`...)
	b = a.ExpiresAt.AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","remaining":{"tokens":`...)
	b = strconv.AppendInt(b, a.Remaining.Tokens, 10)
	b = append(b, `,"requests":`...)
	b = appendJSONInt(b, a.Remaining.Requests)
	b = append(b, `,"period_budget":`...)
	b = appendJSONInt(b, a.Remaining.PeriodBudget)
	return append(b, "}}\n"...), true
}

// rfc3339Year: time.Time's MarshalJSON refuses years outside 0-9999.
func rfc3339Year(t time.Time) bool { return t.Year() >= 0 && t.Year() <= 9999 }

func appendJSONInt(b []byte, n *int64) []byte {
	if n == nil {
		return append(b, "null"...)
	}
	return strconv.AppendInt(b, *n, 10)
}

// appendJSONString quotes s as encoding/json does. Ids and model names are
// printable ASCII, written as they are; anything else (a character to
// escape, HTML's three, a byte past ASCII) is left to encoding/json.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s) // a string always encodes
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}
