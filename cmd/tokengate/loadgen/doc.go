// Package loadgen drives a tokengate server the way a gateway does: admit,
// then settle (or release) with the usage the model reported. It speaks
// either face a gateway uses: the HTTP API with tenant keys, or the rate
// limit service (Envoy's envoy.service.ratelimit.v3, over gRPC) with a
// gateway credential, where the stream-end call (phase=response, the same
// request_id) settles. Both report the same figures (throughput, latency
// percentiles, rejections by limit), so that faces can be compared under
// one load, and other rate limit services driven by the same calls. It is
// used for benchmarks and for demo traffic.
//
// It imports none of the module's packages: it speaks to a replica over
// the wire, as a gateway would.
package loadgen
