#!/usr/bin/env bash
# peer.sh: tokengate's rate limit service against the one users compare it
# to, envoyproxy/ratelimit on Redis, in one run, driven by the same gRPC load
# generator (tokengate loadgen --rls). Three systems:
#   tokengate         serve --rls-addr, on the durable Postgres of lib.sh
#   peer              envoyproxy/ratelimit on Redis with its defaults (no AOF)
#   peer-durable      the same on Redis with --appendonly yes --appendfsync
#                     always: every counter write on disk before the answer,
#                     as a Postgres commit is
# and four loads: one hot tenant or 64, admit only or admit + settle (two
# calls per LLM request: the check when it starts, the usage when its stream
# ends; for tokengate phase=response with the same request_id, for the peer
# the same tenant descriptor again with hits_addend = the usage, as Envoy AI
# Gateway charges tokens). Limits never refuse: what is measured is the cost
# of deciding. The systems take turns, in alternating order, ROUNDS rounds.
#
# Prints a markdown table of the medians (a mean of the middle two for an
# even count) and the ratios; each run's figures go to stderr as it ends:
# calls/s, LLM requests/s, admit p50 and p99 ms, CPU us per LLM request of
# the server, of its store and of the load generator, the server's peak RSS
# MB.
#
#   peer.sh
#   BENCH_SECONDS (15)  BENCH_CLIENTS (32)  BENCH_RLS_CONNS (2)  ROUNDS (2)  PG_IMAGE  TOKENGATE (bin/tokengate)
#   BENCH_PG_NAME (tokengate-bench-peer-pg)  BENCH_PG_PORT (55434)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

rounds="${ROUNDS:-2}"
conns="${BENCH_RLS_CONNS:-2}"
export BENCH_PG_NAME="${BENCH_PG_NAME:-tokengate-bench-peer-pg}" BENCH_PG_PORT="${BENCH_PG_PORT:-55434}"
# The peer, pinned: a pseudo-version of envoyproxy/ratelimit's main branch
# (it tags no releases), built once into bin/.
peer_version=v1.4.1-0.20260122083618-3fb702589d36
peer_bin="bin/ratelimit-$peer_version"
# Loopback ports apart from compare.sh's and faces.sh's.
tg_http=18280 tg_rls=18281
redis_fast=16379 redis_durable=16380
peer_fast=18282 peer_durable=18286 # gRPC; the HTTP, debug and metrics ports follow it

sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
if ! command -v redis-server >/dev/null 2>&1; then
	echo "peer: installing redis-server with apt (once)" >&2
	$sudo apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends redis-server >/dev/null
fi
if [ ! -x "$peer_bin" ]; then
	echo "peer: building envoyproxy/ratelimit $peer_version (once)" >&2
	gobin="$(mktemp -d)"
	GOBIN="$gobin" go install "github.com/envoyproxy/ratelimit/src/service_cmd@$peer_version"
	mkdir -p bin && mv "$gobin/service_cmd" "$peer_bin" && rm -rf "$gobin"
fi

. integration/bench/lib.sh

mid() { sort -n | awk '{a[NR]=$1} END {if (NR % 2) print a[(NR+1)/2]; else printf "%.10g\n", (a[NR/2] + a[NR/2+1]) / 2}'; }
col_mid() { cut -d' ' -f"$2" "$1" | mid; }
tcp_up() { { exec 3<>"/dev/tcp/127.0.0.1/$1"; } 2>/dev/null && exec 3<&-; }
wait_port() { # port log
	for _ in $(seq 100); do tcp_up "$1" && return; sleep 0.1; done
	say "peer: nothing listens on $1"; cat "$2" >&2; exit 1
}

# Redis: two processes of our own on loopback, no snapshots, in $work.
redis() { # port [flags] -> pid
	local p="$1"; shift
	mkdir -p "$work/redis-$p"
	redis-server --port "$p" --bind 127.0.0.1 --dir "$work/redis-$p" --save '' --daemonize no "$@" >"$work/redis-$p.log" 2>&1 &
	echo $!
}
rfast=$(redis $redis_fast); pids+=("$rfast")
rdurable=$(redis $redis_durable --appendonly yes --appendfsync always); pids+=("$rdurable")
wait_port $redis_fast "$work/redis-$redis_fast.log"
wait_port $redis_durable "$work/redis-$redis_durable.log"
[ "$(redis-cli -p $redis_durable config get appendfsync | tail -n1)" = always ] || { say "peer: Redis on $redis_durable does not fsync each write"; exit 1; }

# The peer's configuration: domain tokengate, a counter per value of the
# key tenant, with a limit that never refuses.
mkdir -p "$work/runtime/ratelimit/config"
cat >"$work/runtime/ratelimit/config/tokengate.yaml" <<'EOF'
domain: tokengate
descriptors:
  - key: tenant
    rate_limit:
      unit: hour
      requests_per_unit: 4000000000
EOF
# Its stats go to Prometheus (as tokengate's do): with USE_STATSD=false
# alone they would be written to its log every 10 s. Redis pipelining stays
# at its defaults (REDIS_PIPELINE_WINDOW=0: each write flushed at once;
# REDIS_PIPELINE_LIMIT is unused), and so does REDIS_POOL_SIZE (10).
peer() { # grpc_port redis_port -> pid; its HTTP, debug and metrics ports follow grpc_port
	env -i RUNTIME_ROOT="$work/runtime" RUNTIME_SUBDIRECTORY=ratelimit RUNTIME_APPDIRECTORY=config \
		RUNTIME_WATCH_ROOT=false RUNTIME_IGNOREDOTFILES=true \
		USE_STATSD=false USE_PROMETHEUS=true PROMETHEUS_ADDR=127.0.0.1:$(($1 + 3)) LOG_LEVEL=warn BACKEND_TYPE=redis \
		REDIS_SOCKET_TYPE=tcp REDIS_TYPE=SINGLE REDIS_URL="127.0.0.1:$2" \
		GRPC_HOST=127.0.0.1 GRPC_PORT="$1" HOST=127.0.0.1 PORT=$(($1 + 1)) DEBUG_HOST=127.0.0.1 DEBUG_PORT=$(($1 + 2)) \
		"$peer_bin" >"$work/peer-$1.log" 2>&1 &
	echo $!
}
pfast=$(peer $peer_fast $redis_fast); pids+=("$pfast")
pdurable=$(peer $peer_durable $redis_durable); pids+=("$pdurable")
wait_port $peer_fast "$work/peer-$peer_fast.log"
wait_port $peer_durable "$work/peer-$peer_durable.log"

# tokengate: one replica, a gateway credential for all the tenants lib.sh made.
tenants=(hot); for i in $(seq -w 1 64); do tenants+=("t$i"); done
gateway=$("$bin" gateway create bench --tenants "$(IFS=,; echo "${tenants[*]}")" 2>/dev/null)
server=$(serve $tg_http --rls-addr 127.0.0.1:$tg_rls); pids+=("$server")
wait_ready $tg_http

# Each system: its server, its store (a Redis process, or "pg": the
# Postgres container) and how the load generator speaks to it.
declare -A srv=([tokengate]=$server [peer]=$pfast [peer-durable]=$pdurable)
declare -A store=([tokengate]=pg [peer]=$rfast [peer-durable]=$rdurable)
tokengate=(--rls 127.0.0.1:$tg_rls --gateway "$gateway")
peer=(--rls 127.0.0.1:$peer_fast --rls-descriptors tenant)
peer_durable=(--rls 127.0.0.1:$peer_durable --rls-descriptors tenant)
systems=(tokengate peer peer-durable)
flags_of() { echo "${1//-/_}"; }
spread=(); for i in $(seq -w 1 64); do spread+=(--tenant "t$i"); done

store_cpu_ns() { if [ "$1" = pg ]; then pg_cpu_ns; else proc_cpu_ns "$1"; fi; }
# measure label system -- loadgen flags -> "calls/s llm/s p50_ms p99_ms server_us store_us loadgen_us rss_mb"
measure() {
	local label="$1" sys="$2"; shift 3
	local sp="${srv[$sys]}" st="${store[$sys]}"
	{ echo 5 >"/proc/$sp/clear_refs"; } 2>/dev/null || true # restart the peak RSS (VmHWM) at this run
	local c0 s0; c0=$(store_cpu_ns "$st"); s0=$(proc_cpu_ns "$sp")
	( "$bin" loadgen --json --concurrency "$clients" --rls-conns "$conns" --duration "${secs}s" "$@" >"$work/load.json"; times >"$work/load.times" )
	local c1 s1; c1=$(store_cpu_ns "$st"); s1=$(proc_cpu_ns "$sp")
	local rss; rss=$(awk '/VmHWM/ {print $2}' "/proc/$sp/status")
	local js lu ls; js=$(cat "$work/load.json"); read -r lu ls < <(sed -n 2p "$work/load.times")
	num() { sed -n "s/.*\"$1\":\([0-9.e+]*\).*/\1/p" <<<"$js"; }
	local dur req adm settled errs p50 p99
	dur=$(num duration_ns) req=$(num requests) adm=$(num admitted) settled=$(num settled) errs=$(num errors)
	p50=$(sed -n 's/.*"admit_latency":{[^}]*"p50_ns":\([0-9]*\).*/\1/p' <<<"$js")
	p99=$(sed -n 's/.*"admit_latency":{[^}]*"p99_ns":\([0-9]*\).*/\1/p' <<<"$js")
	[ "$errs" = 0 ] || say "$label: $errs errors"
	[ "$req" = "$adm" ] || say "$label: $((req - adm)) refused: $js"
	[ "$adm" -gt 0 ] || { say "$label: admitted nothing: $js"; exit 1; }
	awk -v d="$dur" -v r="$req" -v a="$adm" -v n="$settled" -v p50="$p50" -v p99="$p99" \
		-v s="$((s1 - s0))" -v c="$((c1 - c0))" -v lu="$(secs_of "$lu")" -v ls="$(secs_of "$ls")" -v rss="$rss" \
		'BEGIN{printf "%.0f %.0f %.2f %.2f %.0f %.0f %.0f %.0f\n", (r + n) / (d / 1e9), a / (d / 1e9), p50 / 1e6, p99 / 1e6,
			s / 1000 / a, c / 1000 / a, (lu + ls) * 1e6 / a, rss / 1024}'
}

# A short run of each system first: it opens the connections, fills the
# peer's Redis keys and fails loudly if a system admits nothing.
for sys in "${systems[@]}"; do
	declare -n flags="$(flags_of "$sys")"
	secs=2 measure "warm-$sys" "$sys" -- "${flags[@]}" --tenant hot >/dev/null
	secs=2 measure "warm-$sys-64" "$sys" -- "${flags[@]}" "${spread[@]}" >/dev/null
done
analyze

load0=$(loadavg)
say "peer: $rounds rounds of ${secs}s per load and system, $clients callers over $conns connections; load average $load0"
declare -A m=()
loads=(hot hot-settle spread spread-settle)
declare -A names=([hot]="one hot tenant, admit only" [hot-settle]="one hot tenant, admit + settle"
	[spread]="64 tenants, admit only" [spread-settle]="64 tenants, admit + settle")
for load in "${loads[@]}"; do
	case $load in
	hot) lf=(--tenant hot --no-settle) ;;
	hot-settle) lf=(--tenant hot --settle) ;;
	spread) lf=("${spread[@]}" --no-settle) ;;
	spread-settle) lf=("${spread[@]}" --settle) ;;
	esac
	for sys in "${systems[@]}"; do : >"$work/$load-$sys"; done
	for i in $(seq "$rounds"); do
		order=("${systems[@]}"); [ $((i % 2)) = 1 ] || order=(peer-durable peer tokengate)
		for sys in "${order[@]}"; do
			declare -n flags="$(flags_of "$sys")"
			measure "$load-$sys" "$sys" -- "${flags[@]}" "${lf[@]}" >>"$work/$load-$sys"
			say "$load, $sys, round $i: $(tail -n1 "$work/$load-$sys") (load average $(loadavg))"
		done
	done
	for sys in "${systems[@]}"; do
		for col in 1 2 3 4 5 6 7 8; do m[$load,$sys,$col]=$(col_mid "$work/$load-$sys" "$col"); done
	done
done

lease_paths $tg_http

printf '| load | system | calls/s | LLM requests/s | admit p50 (ms) | admit p99 (ms) | server CPU us/req | store CPU us/req | load generator CPU us/req | server peak RSS (MB) |\n'
printf '|---|---|---|---|---|---|---|---|---|---|\n'
for load in "${loads[@]}"; do
	for sys in "${systems[@]}"; do
		printf '| %s | %s |' "${names[$load]}" "$sys"
		for col in 1 2 3 4 5 6 7 8; do
			fmt=' %.0f |'; [ $col != 3 ] && [ $col != 4 ] || fmt=' %.2f |'
			printf "$fmt" "${m[$load,$sys,$col]}"
		done
		printf '\n'
	done
done
printf '\n| load | calls/s, tokengate/peer-durable | server+store CPU per LLM request, tokengate/peer-durable | calls/s, tokengate/peer | server+store CPU per LLM request, tokengate/peer |\n|---|---|---|---|---|\n'
for load in "${loads[@]}"; do
	cpu() { awk -v a="${m[$load,$1,5]}" -v b="${m[$load,$1,6]}" 'BEGIN{print a + b}'; }
	printf '| %s | %s | %s | %s | %s |\n' "${names[$load]}" \
		"$(div "${m[$load,tokengate,1]}" "${m[$load,peer-durable,1]}")" "$(div "$(cpu tokengate)" "$(cpu peer-durable)")" \
		"$(div "${m[$load,tokengate,1]}" "${m[$load,peer,1]}")" "$(div "$(cpu tokengate)" "$(cpu peer)")"
done
# Each round's own ratio (its tokengate run over its durable peer's run,
# which ran next to it): the medians above can pair a fast run of one with
# a slow run of the other; these show how far this machine moved the ratio
# within the load.
printf '\n| load | calls/s over peer-durable, round by round |\n|---|---|\n'
for load in "${loads[@]}"; do
	printf '| %s | %s |\n' "${names[$load]}" "$(paste -d' ' <(cut -d' ' -f1 "$work/$load-tokengate") <(cut -d' ' -f1 "$work/$load-peer-durable") |
		awk '{printf "%s%.2f", (NR > 1 ? ", " : ""), $1 / $2}')"
done
for f in "$work"/peer-*.log; do # its start logs at level warning; errors matter
	! grep -qE 'level=(error|fatal|panic)' "$f" || say "peer: $(basename "$f"): $(grep -cE 'level=(error|fatal|panic)' "$f") errors, the last: $(grep -E 'level=(error|fatal|panic)' "$f" | tail -n 3)"
done
printf '\n%s callers over %s gRPC connections, %s s per run, medians of %s rounds; %s cores; %s; envoyproxy/ratelimit %s; load average %s at the start, %s at the end.\n' \
	"$clients" "$conns" "$secs" "$rounds" "$(nproc)" "$(redis-server --version | cut -d' ' -f1-3)" "$peer_version" "$load0" "$(loadavg)"
