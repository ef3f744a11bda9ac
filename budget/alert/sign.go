package alert

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Headers of a delivery. The signature header reads
// "t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">", as Stripe's
// does: a receiver recomputes it with the endpoint's secret, compares in
// constant time, and refuses timestamps too far from its clock (replays).
const (
	HeaderSignature = "Tokengate-Signature"
	HeaderTimestamp = "Tokengate-Timestamp"
	HeaderEventID   = "Tokengate-Event-Id"
	HeaderEventType = "Tokengate-Event-Type"
)

// SecretPrefix starts every endpoint secret, so that scanners spot leaks.
const SecretPrefix = "whsec_"

// deriveSecret is an endpoint's signing secret: HMAC-SHA256 of its id and
// salt under the server's alert key. Neither it nor the key is stored.
func deriveSecret(key []byte, endpointID string, salt []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("tokengate alert endpoint\x00" + endpointID + "\x00"))
	m.Write(salt)
	return SecretPrefix + base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// Sign returns the signature header for body sent at t.
func Sign(secret string, t time.Time, body []byte) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	return "t=" + ts + ",v1=" + mac(secret, ts, body)
}

func mac(secret, ts string, body []byte) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(ts + "."))
	m.Write(body)
	return hex.EncodeToString(m.Sum(nil))
}

// ErrSignature is returned by Verify for a missing, malformed, wrong or
// stale signature.
var ErrSignature = errors.New("alert: signature does not verify")

// Verify checks a delivery as a receiver would: header is the
// Tokengate-Signature value, tolerance how far its timestamp may be from
// now (5 minutes is usual). Any v1 in the header may match (a header may
// carry several during a secret rotation).
func Verify(secret, header string, body []byte, tolerance time.Duration, now time.Time) error {
	var ts string
	var sigs []string
	for _, part := range strings.Split(header, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		switch {
		case !ok:
		case k == "t":
			ts = v
		case k == "v1":
			sigs = append(sigs, v)
		}
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || len(sigs) == 0 {
		return fmt.Errorf("%w: malformed header", ErrSignature)
	}
	if d := now.Sub(time.Unix(sec, 0)); d > tolerance || d < -tolerance {
		return fmt.Errorf("%w: timestamp %s from now", ErrSignature, d.Round(time.Second))
	}
	want := mac(secret, ts, body)
	for _, s := range sigs {
		if hmac.Equal([]byte(s), []byte(want)) {
			return nil
		}
	}
	return fmt.Errorf("%w: no signature matches", ErrSignature)
}
