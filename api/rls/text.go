package rls

import (
	"errors"
	"strconv"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/tokengate/tokengate/budget/rule"
)

// checkEntries refuses a descriptor entry, key or value, that cannot be
// stored as text (a NUL, or not UTF-8): the tenant, model and request id
// reach Postgres, which would refuse them (SQLSTATE 22021) as if it were
// down. The error names the descriptor and the entry; the call answers
// INVALID_ARGUMENT.
func checkEntries(req *rlsv3.RateLimitRequest) error {
	if why := rule.TextProblem(req.GetDomain()); why != "" {
		return errors.New("domain " + why)
	}
	for i, d := range req.GetDescriptors() {
		for j, e := range d.GetEntries() {
			at := "descriptor " + strconv.Itoa(i) + ": entry " + strconv.Itoa(j)
			if why := rule.TextProblem(e.GetKey()); why != "" {
				return errors.New(at + ": key " + why)
			}
			if why := rule.TextProblem(e.GetValue()); why != "" {
				return errors.New(at + " (" + e.GetKey() + "): value " + why)
			}
		}
	}
	return nil
}

// Connection bounds of the rate limit service's gRPC server, named once.
const (
	// HandshakeTimeout bounds a new connection's setup (the HTTP/2
	// preface and settings): a client that connects and sends nothing is
	// dropped.
	HandshakeTimeout = 10 * time.Second
	// KeepaliveMinTime is the most often a client may ping; a client that
	// pings more often is disconnected (ENHANCE_YOUR_CALM).
	KeepaliveMinTime = 10 * time.Second
	// KeepaliveTime and KeepaliveTimeout: the server pings an idle
	// connection after KeepaliveTime and closes it if the ping is not
	// answered within KeepaliveTimeout, so dead peers free their slot.
	KeepaliveTime    = 2 * time.Minute
	KeepaliveTimeout = 20 * time.Second
	// StreamWorkers are the goroutines kept to run calls. Without them
	// gRPC starts a goroutine per call, whose stack then grows, by copying,
	// to the depth of a decision: 7 % of the replica's CPU in profiles. A
	// call finding every worker busy still gets a goroutine of its own.
	StreamWorkers = 64
)

// ServerOptions are the options of the gRPC server the service runs on:
// the handshake timeout, keepalive enforcement and the stream workers.
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.NumStreamWorkers(StreamWorkers),
		grpc.ConnectionTimeout(HandshakeTimeout),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: KeepaliveMinTime, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: KeepaliveTime, Timeout: KeepaliveTimeout}),
	}
}
