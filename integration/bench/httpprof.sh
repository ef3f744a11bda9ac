#!/usr/bin/env bash
# httpprof.sh: a CPU profile of one tokengate binary's serve under the HTTP
# API's hot admit-only load (one tenant, 32 callers), on its own durable
# Postgres and schema, so that binaries of different schemas can be
# profiled one after the other and compared per admission.
#
#   httpprof.sh [BINARY (bin/tokengate)] [OUT (/tmp/httpprof.pb.gz)]
#   then: go tool pprof -top -cum BINARY OUT
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export TOKENGATE="${1:-bin/tokengate}"
out="${2:-/tmp/httpprof.pb.gz}"
. integration/bench/lib.sh
s=$(BENCH_SERVE_FLAGS="--pprof-addr 127.0.0.1:16060" serve 18080); pids+=("$s")
wait_ready 18080
"$bin" loadgen --concurrency 32 --duration 16s --url http://127.0.0.1:18080 --key "$hot_key" --no-settle >"$work/load.txt" 2>&1 &
lg=$!
sleep 4 # the load reaches its steady state before the profile starts
curl -s -o "$out" "http://127.0.0.1:16060/debug/pprof/profile?seconds=10"
wait "$lg" || true
head -1 "$work/load.txt"
say "profile: $out (10 s of the 16 s load)"
