#!/usr/bin/env bash
# pgcost.sh: what Postgres spends, in CPU, on each part of a leased
# admission's write path, one part at a time on a quiet durable Postgres
# (integration/bench/pgcost): a transaction and its commit, a statement more
# in its pipeline, a lease journal group's insert by group size, a booking's
# ledger entries (its statement, COPY, the table without indexes). Prints a
# markdown table, Postgres's CPU per transaction and per unit (the median of
# ROUNDS measurements of GROUPS transactions each).
#
#   pgcost.sh
#   PGCOST_GROUPS (400)  ROUNDS (3)  PG_IMAGE  TOKENGATE (bin/tokengate: migrates)
#   BENCH_PG_NAME (tokengate-bench-pgcost-pg)  BENCH_PG_PORT (55436)
#
# Postgres runs in its container (its CPU is its cgroup's); BENCH_PG_HOST
# is not supported here.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
[ "${BENCH_PG_HOST:-}" != 1 ] || { echo "pgcost: Postgres in its container only (BENCH_PG_HOST=1 is not supported)" >&2; exit 2; }
export BENCH_PG_NAME="${BENCH_PG_NAME:-tokengate-bench-pgcost-pg}" BENCH_PG_PORT="${BENCH_PG_PORT:-55436}"
. integration/bench/lib.sh
[ -r "$cgroup" ] || { say "pgcost: cannot read the container's CPU at $cgroup"; exit 1; }
say "pgcost: $(loadavg) load average at the start"
go run ./integration/bench/pgcost --url "$url" --cpu-file "$cgroup" --groups "${PGCOST_GROUPS:-400}" --rounds "${ROUNDS:-3}"
say "pgcost: $(loadavg) load average at the end"
