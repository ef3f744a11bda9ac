package api

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"
)

// The admission's answer, encoded by hand, is byte for byte what
// encoding/json's Encoder writes, whatever its strings, numbers and times
// hold.
func TestAdmittedJSONAsEncodingJSON(t *testing.T) {
	t.Parallel()
	seven, minus := int64(7), int64(-3)
	at := time.Date(2026, 12, 7, 4, 30, 1, 123456789, time.UTC)
	for _, a := range []admittedJSON{
		{ID: "adm_01JEXAMPLE", Admitted: true, Model: "gpt-4o-mini", Estimate: estimateJSON{InputTokens: 31, OutputTokens: 100, Cost: 131},
			CreatedAt: at, ExpiresAt: at.Add(10 * time.Minute), Remaining: remainingJSON{Tokens: 999}},
		{ID: "", Model: `a "quoted" \ model <b>&`, Estimate: estimateJSON{Approximate: true, Cost: -1},
			CreatedAt: at.In(time.FixedZone("x", -5*3600-30*60)), ExpiresAt: time.Time{},
			Remaining: remainingJSON{Tokens: -5, Requests: &seven, PeriodBudget: &minus}},
		{ID: "adm_é\u2028\x01", Model: "模型\xff", CreatedAt: at.Truncate(time.Second), ExpiresAt: at.Add(time.Millisecond),
			Remaining: remainingJSON{Requests: &minus}},
	} {
		var want bytes.Buffer
		if err := json.NewEncoder(&want).Encode(a); err != nil {
			t.Fatal(err)
		}
		got, ok := a.appendJSON(nil)
		if !ok || string(got) != want.String() {
			t.Errorf("by hand (%v):\n%s\nencoding/json:\n%s", ok, got, want.String())
		}
	}
	// A time encoding/json refuses is left to it.
	if _, ok := (admittedJSON{CreatedAt: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}).appendJSON(nil); ok {
		t.Error("a year past 9999 was encoded by hand")
	}
}
