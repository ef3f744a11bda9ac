//go:build !race

package memtest

// RSSFactor is how much more than the heap the resident set may grow by:
// without the race detector, the heap and what the runtime keeps of it.
const RSSFactor = 1
