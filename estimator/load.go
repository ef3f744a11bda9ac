package estimator

import "sync"

// Load builds both encodings' tables now, in parallel, instead of on the
// first request that needs each. Building them takes about a second of CPU
// (o200k_base 1.0-1.6 s, cl100k_base 0.6 s; several times that under the race
// detector): paid inside a request, it would become that request's latency,
// and a client timeout would turn it into retries. `tokengate serve` calls
// it before it serves, and tests that time requests call it first. Calling
// it again costs nothing.
func Load() error {
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, name := range []string{EncodingO200K, EncodingCL100K} {
		wg.Go(func() { _, errs[i] = getEncoder(name) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
