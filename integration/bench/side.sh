#!/usr/bin/env bash
# side.sh: two tokengate binaries, A (before) and B (after), at the same
# moment, each on a durable Postgres of its own (so each reads its own
# schema: any two releases compare), under the same load. Sequential runs
# on this shared two-core machine drift more than most changes (one binary
# moved 2404 to 4398 admissions/s between runs minutes apart); two sides
# run at once see the same disk, the same neighbours and the same clock,
# so their ratio holds where sequential medians do not. ROUNDS rounds per
# load, the sides swapping ports and Postgres names each round.
#
#   side.sh OLD_BINARY [NEW_BINARY (bin/tokengate)]
#   BENCH_SECONDS (12)  BENCH_CLIENTS (32)  ROUNDS (4)  PG_IMAGE
#   LOADS ("hot spread settle"; hot4, spread4, settle4: four replicas a side;
#          rls-hot rls-spread rls-hot-settle rls-spread-settle: the rate limit
#          service's gRPC face, as bench-peer drives it, BENCH_RLS_CONNS (2))
#
# Prints, per load, each round's admissions/s of A and B, the geometric
# mean of B/A, and the median server and Postgres CPU per admission of
# each side (each side's Postgres is its own: a change of what the store
# does shows in its column, where the rate's noise would hide it).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

if [ "${SIDE_ONE:-}" = 1 ]; then
	# One side: serve, warm, say ready, wait for the start, run the load.
	# SIDE_PORT SIDE_LOAD SIDE_DIR; $TOKENGATE and $BENCH_PG_NAME/PORT set by the caller.
	. integration/bench/lib.sh
	# A load named with a 4 (hot4, spread4, settle4) runs on four replicas
	# of the side, at SIDE_PORT, +100, +200, +300, as compare.sh's.
	n=1; [ "${SIDE_LOAD%4}" = "$SIDE_LOAD" ] || n=4
	ss=(); urls=()
	if [ "${SIDE_LOAD#rls-}" != "$SIDE_LOAD" ]; then
		# The gRPC face: one replica, a gateway credential for every tenant
		# lib.sh made, the loads of peer.sh.
		tenants=(hot); for i in $(seq -w 1 64); do tenants+=("t$i"); done
		gw=$("$bin" gateway create bench --tenants "$(IFS=,; echo "${tenants[*]}")" 2>/dev/null)
		rls=$((SIDE_PORT + 50))
		s=$(serve "$SIDE_PORT" --rls-addr "127.0.0.1:$rls"); pids+=("$s")
		wait_ready "$SIDE_PORT"
		spread=(); for i in $(seq -w 1 64); do spread+=(--tenant "t$i"); done
		case ${SIDE_LOAD#rls-} in
		hot) f=(--tenant hot --no-settle) ;;
		hot-settle) f=(--tenant hot --settle) ;;
		spread) f=("${spread[@]}" --no-settle) ;;
		spread-settle) f=("${spread[@]}" --settle) ;;
		esac
		# Warm with the load itself, then analyze, as lib.sh's warm does for
		# the HTTP loads: statements prepared on empty tables keep plans
		# made for them until autovacuum's first analyze, a minute in.
		secs=2 run warm "$s" -- --rls "127.0.0.1:$rls" --gateway "$gw" --rls-conns "${BENCH_RLS_CONNS:-2}" "${f[@]}" >/dev/null
		analyze
		touch "$SIDE_DIR/ready-$SIDE_PORT"
		while [ ! -e "$SIDE_DIR/go" ]; do sleep 0.05; done
		run "$SIDE_LOAD" "$s" -- --rls "127.0.0.1:$rls" --gateway "$gw" --rls-conns "${BENCH_RLS_CONNS:-2}" "${f[@]}"
		exit 0
	fi
	for i in $(seq 0 $((n - 1))); do
		p=$((SIDE_PORT + 100 * i))
		if [ "$n" = 4 ]; then s=$(serve "$p" --max-conns 8 --replica-id "r$p"); else s=$(serve "$p"); fi
		pids+=("$s"); ss+=("$s"); urls+=(--url "http://127.0.0.1:$p")
	done
	for i in $(seq 0 $((n - 1))); do wait_ready $((SIDE_PORT + 100 * i)); done
	warm "http://127.0.0.1:$SIDE_PORT"
	touch "$SIDE_DIR/ready-$SIDE_PORT"
	while [ ! -e "$SIDE_DIR/go" ]; do sleep 0.05; done
	case ${SIDE_LOAD%4} in
	hot) f=(--key "$hot_key" --no-settle) ;;
	spread) f=("${spread_keys[@]}" --no-settle) ;;
	settle) f=(--key "$hot_key" --settle) ;;
	esac
	run "$SIDE_LOAD" "${ss[@]}" -- "${urls[@]}" "${f[@]}"
	exit 0
fi

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
old="${1:?usage: side.sh OLD_BINARY [NEW_BINARY]}"
new="${2:-bin/tokengate}"
rounds="${ROUNDS:-4}"
export BENCH_SECONDS="${BENCH_SECONDS:-12}"
dir="$(mktemp -d /tmp/side.XXXXXX)"
trap 'rm -rf "$dir"' EXIT

one() { # binary port pgname pgport load -> a side in the background, its figures in $dir/out-port
	SIDE_ONE=1 SIDE_PORT="$2" SIDE_LOAD="$5" SIDE_DIR="$dir" TOKENGATE="$1" BENCH_PG_NAME="$3" BENCH_PG_PORT="$4" \
		"$0" >"$dir/out-$2" 2>"$dir/err-$2" &
}
both() { # binary-on-18090 binary-on-18091 load
	rm -f "$dir"/ready-* "$dir/go"
	one "$1" 18090 tokengate-side-a 55501 "$3"; local p1=$!
	one "$2" 18091 tokengate-side-b 55502 "$3"; local p2=$!
	for _ in $(seq 1500); do [ -e "$dir/ready-18090" ] && [ -e "$dir/ready-18091" ] && break; sleep 0.2; done
	touch "$dir/go"
	wait "$p1" || { cat "$dir/err-18090" >&2; exit 1; }
	wait "$p2" || { cat "$dir/err-18091" >&2; exit 1; }
}

printf 'side by side: %s rounds of %ss per load; A=%s B=%s\n\n' "$rounds" "$BENCH_SECONDS" "$old" "$new" >&2
printf '| load | A admissions/s (rounds) | B admissions/s (rounds) | B/A (geometric mean) | server CPU us/adm, A / B (medians) | Postgres CPU us/adm, A / B (medians) |\n|---|---|---|---|---|---|\n'
for load in ${LOADS:-hot spread settle}; do
	: >"$dir/a"; : >"$dir/b"
	for i in $(seq "$rounds"); do
		if [ $((i % 2)) = 1 ]; then
			both "$old" "$new" "$load"; cat "$dir/out-18090" >>"$dir/a"; cat "$dir/out-18091" >>"$dir/b"
		else
			both "$new" "$old" "$load"; cat "$dir/out-18091" >>"$dir/a"; cat "$dir/out-18090" >>"$dir/b"
		fi
	done
	ra=$(cut -d' ' -f1 "$dir/a" | paste -sd, -); rb=$(cut -d' ' -f1 "$dir/b" | paste -sd, -)
	gm=$(paste -d' ' "$dir/a" "$dir/b" | awk '{s += log($7 / $1); n++} END {printf "%.2f", exp(s / n)}')
	ca=$(cut -d' ' -f3 "$dir/a" | median); cb=$(cut -d' ' -f3 "$dir/b" | median)
	pa=$(cut -d' ' -f4 "$dir/a" | median); pb=$(cut -d' ' -f4 "$dir/b" | median)
	printf '| %s | %s | %s | %s | %s / %s | %s / %s |\n' "$load" "$ra" "$rb" "$gm" "$ca" "$cb" "$pa" "$pb"
done
