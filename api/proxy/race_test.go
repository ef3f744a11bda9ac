//go:build race

package proxy_test

// rssFactor is how much more than the heap the resident set may grow by
// under the race detector, which shadows the heap (measured: about three
// times).
const rssFactor = 4
