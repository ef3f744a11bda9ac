// Package cluster tests tokengate as it runs in production: several
// replicas, each its own container from the tc.local/tokengate image, and
// one Postgres, on one Docker network; and what happens when Postgres
// pauses, restarts, or a replica dies. The tests need `make image` and run
// with `make test-cluster` (build tag cluster).
package cluster
