#!/usr/bin/env bash
# ab.sh: two tokengate binaries, A (before) and B (after), on one durable
# Postgres, under the same load, taking turns: ROUNDS rounds of each load,
# A and B going first in alternate rounds, so that both see the same
# machine (run-to-run drift on a shared two-core machine is larger than
# most changes). Prints, per load, each
# side's median admissions/s and CPU per admission, and B/A.
#
#   ab.sh OLD_BINARY [NEW_BINARY (bin/tokengate)]
#   BENCH_SECONDS (15)  BENCH_CLIENTS (32)  ROUNDS (3)  PG_IMAGE
#
# For a commit: git worktree add /tmp/old REV && (cd /tmp/old && go build -o bin/tokengate ./cmd/tokengate)
# then: make build && integration/bench/ab.sh /tmp/old/bin/tokengate
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

old="${1:?usage: ab.sh OLD_BINARY [NEW_BINARY]}"
new="${2:-bin/tokengate}"
rounds="${ROUNDS:-3}"
export TOKENGATE="$new" # the schema, the tenants and the load generator are B's
. integration/bench/lib.sh

bin="$old"; sa=$(serve 18080); pids+=("$sa")
bin="$new"; sb=$(serve 18081); pids+=("$sb")
wait_ready 18080; wait_ready 18081
warm http://127.0.0.1:18080 http://127.0.0.1:18081

say "ab: $rounds rounds of ${secs}s per load and side; A=$old B=$new"
printf '| load | A admissions/s | B admissions/s | B/A | A CPU us/adm tokengate / Postgres | B CPU us/adm tokengate / Postgres |\n|---|---|---|---|---|---|\n'
for load in hot settle spread; do
	case $load in
	hot) name="one hot tenant, admit only"; flags=(--key "$hot_key" --no-settle) ;;
	settle) name="one hot tenant, admit + settle"; flags=(--key "$hot_key" --settle) ;;
	spread) name="64 tenants, admit only"; flags=("${spread_keys[@]}" --no-settle) ;;
	esac
	: >"$work/a"; : >"$work/b"
	for i in $(seq "$rounds"); do
		# The sides take turns going first: what one side's writes leave
		# Postgres to do (vacuum, checkpoints) lands on both alike.
		order=(a b); [ $((i % 2)) = 1 ] || order=(b a)
		for side in "${order[@]}"; do
			if [ "$side" = a ]; then
				run "$load-a" "$sa" -- --url http://127.0.0.1:18080 "${flags[@]}" >>"$work/a"
			else
				run "$load-b" "$sb" -- --url http://127.0.0.1:18081 "${flags[@]}" >>"$work/b"
			fi
		done
	done
	ra=$(col_median "$work/a" 1); rb=$(col_median "$work/b" 1)
	ca=$(col_median "$work/a" 3); cb=$(col_median "$work/b" 3)
	pa=$(col_median "$work/a" 4); pb=$(col_median "$work/b" 4)
	printf '| %s | %s | %s | %s | %s / %s | %s / %s |\n' "$name" "$ra" "$rb" "$(div "$rb" "$ra")" "$ca" "$pa" "$cb" "$pb"
done
