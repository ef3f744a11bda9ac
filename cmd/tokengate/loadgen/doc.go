// Package loadgen drives a tokengate server over HTTP the way a gateway
// does: admit, then settle (or release) with the usage the model reported.
// It measures what a frontend sees (throughput, latency percentiles,
// rejections by limit) and is used for benchmarks and for demo traffic.
//
// It imports none of the module's packages: it speaks to a replica over HTTP,
// as a gateway would.
package loadgen
