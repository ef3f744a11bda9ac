//go:build race

package estimator

// poolLoss is what a count may allocate beyond the text under the race
// detector, whose sync.Pool drops a quarter of what is put back (by design,
// to shake out code that relies on the pool): a dropped working state is
// built anew and its token lists grow to one chunk's tokens again
// (measured: 8-37 KB a count on 64 KB texts). Without -race the pool keeps
// its states between collections and the bound is the text alone.
const poolLoss = 64 << 10
