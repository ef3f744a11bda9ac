//go:build race

package memtest

// RSSFactor is how much more than the heap the resident set may grow by
// under the race detector, which shadows the heap (measured: about three
// times).
const RSSFactor = 4
