package account

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/puddle/v2"

	"github.com/tokengate/tokengate/budget/rule"
)

// errRetry marks failures after which the whole decision can safely run
// again: serialization failures, deadlocks, and errors that happened before
// anything reached the server.
type errRetry struct{ err error }

func (e errRetry) Error() string { return e.err.Error() }
func (e errRetry) Unwrap() error { return e.err }

// classify turns a driver error met at phase into the package's errors.
// committing says whether COMMIT may have been sent.
func classify(err error, acquiring, committing bool) error {
	if err == nil {
		return nil
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case pgErr.Code == pgerrcode.SerializationFailure || pgErr.Code == pgerrcode.DeadlockDetected:
			return errRetry{err}
		case pgerrcode.IsConnectionException(pgErr.Code), pgErr.Code == pgerrcode.AdminShutdown, pgErr.Code == pgerrcode.CrashShutdown,
			pgErr.Code == pgerrcode.CannotConnectNow, pgErr.Code == pgerrcode.TooManyConnections:
			if committing {
				return fmt.Errorf("%w: %v", rule.ErrOutcomeUnknown, err)
			}
			return fmt.Errorf("%w: %v", rule.ErrUnavailable, err)
		case pgErr.Code == pgerrcode.ReadOnlySQLTransaction:
			// The node answered as a standby: a primary demoted by a
			// failover (Patroni) that still answers, or a URL that reached
			// a replica. The write was refused, so nothing was committed,
			// even at COMMIT: an outage of the primary, for the failure
			// policy, never a 500. The admission layer's MarkDown drops the
			// pool's connections, and new ones go to a writable node only
			// (cmd's pool checks target_session_attrs=read-write).
			return fmt.Errorf("%w: %v", rule.ErrUnavailable, err)
		case pgErr.Code == pgerrcode.NumericValueOutOfRange:
			// Postgres never wraps: bigint arithmetic past int64 is an
			// error, and it is the caller's amount, not an outage.
			return fmt.Errorf("%w: %v", &rule.OverflowError{Field: "amount", Op: "the store's arithmetic"}, err)
		}
		return err // an SQL error: a bug or a constraint, not an outage
	}
	var connectErr *pgconn.ConnectError
	if acquiring && errors.As(err, &connectErr) {
		// A new connection could not be made: the store, not the pool.
		return fmt.Errorf("%w: %v", rule.ErrUnavailable, err)
	}
	if acquiring && errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%w: %v", rule.ErrBusy, err)
	}
	if errors.Is(err, context.Canceled) {
		return err // the caller went away
	}
	var netErr net.Error
	switch {
	case !committing && pgconn.SafeToRetry(err):
		return errRetry{fmt.Errorf("%w: %v", rule.ErrUnavailable, err)}
	case errors.As(err, &connectErr), errors.As(err, &netErr), errors.Is(err, io.EOF),
		errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, context.DeadlineExceeded), pgconn.Timeout(err),
		isClosedConn(err):
		if committing && !pgconn.SafeToRetry(err) {
			return fmt.Errorf("%w: %v", rule.ErrOutcomeUnknown, err)
		}
		return fmt.Errorf("%w: %v", rule.ErrUnavailable, err)
	}
	return err
}

// ReadError classifies the error of a read outside any decision (a ledger
// page, a report, a tally): it wraps ErrUnavailable when the database
// could not be reached (a connection refused, broken or timed out, a node
// shutting down), so that the reads pool can fall back to the primary and
// a face answer 503, and is err itself for an SQL error or a caller gone.
//
// Any failure to connect counts, whatever the server answered (a database
// that refuses connections, one starting up or shutting down): the read
// was not made there.
func ReadError(err error) error {
	var connectErr *pgconn.ConnectError
	if errors.As(err, &connectErr) && !errors.Is(err, rule.ErrUnavailable) {
		return fmt.Errorf("%w: %v", rule.ErrUnavailable, err)
	}
	err = classify(err, true, false)
	var r errRetry
	if errors.As(err, &r) {
		return r.err
	}
	return err
}

func isClosedConn(err error) bool {
	return errors.Is(err, pgconn.ErrConnClosed) || errors.Is(err, puddle.ErrClosedPool)
}

// maxAttempts bounds how often a decision runs when it meets retryable
// failures; backoff doubles from 5 ms with jitter (about 75 ms in all).
const maxAttempts = 4

// retry runs fn until it succeeds, fails for good, or has run maxAttempts
// times. A decision that failed retryably changed nothing (its transaction
// rolled back), so running it again cannot debit twice.
func retry(ctx context.Context, fn func() error) error {
	backoff := 5 * time.Millisecond
	for attempt := 1; ; attempt++ {
		err := fn()
		var r errRetry
		if !errors.As(err, &r) {
			return err
		}
		if attempt == maxAttempts {
			if errors.Is(r.err, rule.ErrUnavailable) {
				return r.err
			}
			return fmt.Errorf("%w: gave up after %d attempts: %v", rule.ErrUnavailable, attempt, r.err)
		}
		sleep := backoff + rand.N(backoff)
		backoff *= 2
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %v", rule.ErrUnavailable, ctx.Err())
		case <-time.After(sleep):
		}
	}
}
