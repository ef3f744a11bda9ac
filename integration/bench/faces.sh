#!/usr/bin/env bash
# faces.sh: the same load through two faces of one replica, the HTTP API
# (tenant key; without, and with, an Idempotency-Key per admission: KEYED)
# and the rate limit service (gRPC, gateway credential), on one
# durable Postgres, taking turns: ROUNDS rounds of each load, the faces in
# alternating order, so that both see the same machine. Prints, per load
# and face, the median admissions/s, admit p99 and CPU per admission, and
# RLS/HTTP. Each run's figures go to stderr as it ends, in the order of
# lib.sh's run: admissions/s, p99 ms, CPU us per admission of tokengate and
# of Postgres, peak RSS MB, the load generator's CPU us per admission.
#
#   faces.sh
#   BENCH_SECONDS (15)  BENCH_CLIENTS (32)  ROUNDS (3)  PG_IMAGE  TOKENGATE (bin/tokengate)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

rounds="${ROUNDS:-3}"
. integration/bench/lib.sh

gateway=$("$bin" gateway create bench --tenants hot 2>/dev/null)
server=$(serve 18080 --rls-addr 127.0.0.1:18181); pids+=("$server")
wait_ready 18080
http=(--url http://127.0.0.1:18080 --key "$hot_key")
# The HTTP API with an Idempotency-Key per admission: the same work as the
# rate limit service, which always keys a reservation by its request id.
keyed=(--url http://127.0.0.1:18080 --key "$hot_key" --idempotency-keys)
rls=(--rls 127.0.0.1:18181 --gateway "$gateway" --tenant hot)

# A short run of each face first: it opens the connections and fails
# loudly if a face admits nothing (a credential it refuses, say).
for face in http keyed rls; do
	declare -n flags="$face"
	"$bin" loadgen --json --concurrency "$clients" --duration 2s "${flags[@]}" >"$work/warm.json"
	grep -q '"admitted":[1-9]' "$work/warm.json" || { say "faces: $face admitted nothing: $(cat "$work/warm.json")"; exit 1; }
done
analyze

load0=$(loadavg)
say "faces: $rounds rounds of ${secs}s per load and face, $clients callers; load average $load0"
printf '| load | face | admissions/s | admit p99 (ms) | tokengate CPU us/adm | Postgres CPU us/adm | load generator CPU us/adm |\n|---|---|---|---|---|---|---|\n'
for load in hot settle; do
	case $load in
	hot) name="one hot tenant, admit only"; mode=--no-settle ;;
	settle) name="one hot tenant, admit + settle"; mode=--settle ;;
	esac
	: >"$work/http"; : >"$work/keyed"; : >"$work/rls"
	for i in $(seq "$rounds"); do
		order=(http keyed rls); [ $((i % 2)) = 1 ] || order=(rls keyed http)
		for face in "${order[@]}"; do
			declare -n flags="$face"
			run "$load-$face" "$server" -- "${flags[@]}" "$mode" >>"$work/$face"
			say "$load, $face, round $i: $(tail -n1 "$work/$face") (load average $(loadavg))"
		done
	done
	declare -A m=()
	for face in http keyed rls; do
		for col in 1 2 3 4 6; do m[$face$col]=$(col_median "$work/$face" "$col"); done
		printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$name" "${face^^}" "${m[${face}1]}" "${m[${face}2]}" "${m[${face}3]}" "${m[${face}4]}" "${m[${face}6]}"
	done
	for base in http keyed; do
		printf '| %s | RLS/%s | %s | %s | %s | %s | %s |\n' "$name" "${base^^}" \
			"$(div "${m[rls1]}" "${m[${base}1]}")" "$(div "${m[rls2]}" "${m[${base}2]}")" "$(div "${m[rls3]}" "${m[${base}3]}")" \
			"$(div "${m[rls4]}" "${m[${base}4]}")" "$(div "${m[rls6]}" "${m[${base}6]}")"
	done
done
printf '\n%s callers, %s s per run, medians of %s rounds; %s cores; load average %s at the start, %s at the end.\n' \
	"$clients" "$secs" "$rounds" "$(nproc)" "$load0" "$(loadavg)"
