package admission

// testSignals tell a test that the Admitter reached a point the test could
// otherwise only guess with a sleep, as River's TestSignals do: a caller is
// queued and about to pause. Only tests install them (export_test.go); in
// production every signal is nil and sending one is a nil check.
type testSignals struct {
	// paused receives the tenant of a caller that is queued (for its
	// tenant's tokens or slots, or for its pool) and about to pause.
	paused testSignal[string]
}

// testSignal is one signal, nil until a test installs it.
type testSignal[T any] struct{ ch chan T }

// install makes the channel the signal is sent on. A test installs it
// before it uses the Admitter.
func (s *testSignal[T]) install() <-chan T {
	s.ch = make(chan T, 64)
	return s.ch
}

// signal sends v if a test listens, and never blocks the code under test:
// a signal the test does not read is dropped once the buffer is full.
func (s *testSignal[T]) signal(v T) {
	if s.ch == nil {
		return
	}
	select {
	case s.ch <- v:
	default:
	}
}
