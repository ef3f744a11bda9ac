package account

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tokengate/tokengate/budget/rule"
)

func TestClassify(t *testing.T) {
	t.Parallel()
	serialization := &pgconn.PgError{Code: "40001"}
	deadlock := &pgconn.PgError{Code: "40P01"}
	shutdown := &pgconn.PgError{Code: "57P01"}
	unique := &pgconn.PgError{Code: "23505"}
	tests := []struct {
		name                  string
		err                   error
		acquiring, committing bool
		retry                 bool
		is                    error
	}{
		{"serialization failure is retried", serialization, false, false, true, nil},
		{"deadlock is retried", deadlock, false, true, true, nil},
		{"admin shutdown before commit", shutdown, false, false, false, rule.ErrUnavailable},
		{"admin shutdown during commit: unknown", shutdown, false, true, false, rule.ErrOutcomeUnknown},
		{"a constraint is a bug, not an outage", unique, false, false, false, nil},
		{"acquire timed out: busy", fmt.Errorf("acquire: %w", context.DeadlineExceeded), true, false, false, rule.ErrBusy},
		{"a query timed out: unavailable", fmt.Errorf("q: %w", context.DeadlineExceeded), false, false, false, rule.ErrUnavailable},
		{"EOF during commit: unknown", io.ErrUnexpectedEOF, false, true, false, rule.ErrOutcomeUnknown},
		{"the caller cancelled", context.Canceled, false, false, false, context.Canceled},
	}
	for _, tt := range tests {
		got := classify(tt.err, tt.acquiring, tt.committing)
		var r errRetry
		if errors.As(got, &r) != tt.retry {
			t.Errorf("%s: %v, retry want %v", tt.name, got, tt.retry)
		}
		if tt.is != nil && !errors.Is(got, tt.is) {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.is)
		}
		if tt.name == "a constraint is a bug, not an outage" && errors.Is(got, rule.ErrUnavailable) {
			t.Errorf("%s: classified as an outage", tt.name)
		}
	}
}

func TestRetryIsBounded(t *testing.T) {
	t.Parallel()
	calls := 0
	err := retry(context.Background(), func() error {
		calls++
		if calls < 3 {
			return errRetry{&pgconn.PgError{Code: "40001"}}
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Fatalf("two serialization failures then success: %v after %d calls", err, calls)
	}
	calls = 0
	err = retry(context.Background(), func() error {
		calls++
		return errRetry{&pgconn.PgError{Code: "40P01"}}
	})
	if calls != maxAttempts || !errors.Is(err, rule.ErrUnavailable) {
		t.Fatalf("endless deadlocks: %v after %d calls, want ErrUnavailable after %d", err, calls, maxAttempts)
	}
}
