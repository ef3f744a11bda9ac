package rls_test

import (
	"strings"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tokengate/tokengate/ledger"
)

// TestNULDescriptorIsInvalidArgument: a descriptor entry with a NUL, key or
// value, is INVALID_ARGUMENT naming the entry, never UNAVAILABLE with the
// database's message; nothing is decided.
func TestNULDescriptorIsInvalidArgument(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for name, tc := range map[string]struct {
		d    *ratelimitv3.RateLimitDescriptor
		want string
	}{
		"model":               {desc("tenant", "acme", "model", "gpt-4o\x00"), "entry 1 (model)"},
		"request id":          {desc("tenant", "acme", "request_id", "req\x00-1"), "entry 1 (request_id)"},
		"response request id": {desc("tenant", "acme", "phase", "response", "request_id", "\x00"), "entry 2 (request_id)"},
		"tenant":              {desc("tenant", "ac\x00me"), "entry 0 (tenant)"},
		"key":                 {desc("tenant", "acme", "mo\x00del", "gpt-4o"), "entry 1: key"},
	} {
		_, err := b.call(t, b.gateway, 10, tc.d)
		if status.Code(err) != codes.InvalidArgument {
			t.Fatalf("%s: %v, want INVALID_ARGUMENT", name, err)
		}
		msg := status.Convert(err).Message()
		if !strings.Contains(msg, tc.want) || !strings.Contains(msg, "NUL") || strings.Contains(msg, "SQLSTATE") {
			t.Fatalf("%s: %q, want it to name %q and the NUL", name, msg, tc.want)
		}
	}
	if tally, err := ledger.Verify(ctx, b.pool, "acme"); err != nil || tally.Entries != 1 {
		t.Fatalf("acme: %d entries (%v): a refused call was decided", tally.Entries, err)
	}
}
