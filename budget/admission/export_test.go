package admission

// PausedSignal installs a's paused test signal: the channel receives the
// tenant of each caller queued and about to pause.
func PausedSignal(a *Admitter) <-chan string { return a.testSignals.paused.install() }
