//go:build !race

package estimator

// poolLoss is what a count may allocate beyond the text: nothing, since
// the pool keeps its working states between collections (race_test.go
// says why -race differs).
const poolLoss = 0
