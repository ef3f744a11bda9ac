# lib.sh: what compare.sh and ab.sh share: one durable Postgres in a container,
# the CPU of processes and of that container, and tokengate replicas driven by
# its load generator. Sourced, from the repository root; $bin is the tokengate
# binary that serve and run use (ab.sh switches it).

secs="${BENCH_SECONDS:-15}"
clients="${BENCH_CLIENTS:-32}"
image="${PG_IMAGE:-tc.local/postgres:15-bookworm}"
bin="${TOKENGATE:-bin/tokengate}"
pg="${BENCH_PG_NAME:-tokengate-bench-pg}" # the container and its port: other names let benches run side by side
port="${BENCH_PG_PORT:-55433}"
work="$(mktemp -d /tmp/bench.XXXXXX)"
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	docker rm -f "$pg" >/dev/null 2>&1 || true
	declare -F pg_host_stop >/dev/null && pg_host_stop
	rm -rf "$work"
}
trap cleanup EXIT

say() { printf '%s\n' "$*" >&2; }
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
col_median() { cut -d' ' -f"$2" "$1" | median; } # file column -> the median of run's figure in that column
div() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2f", a/b}'; }
loadavg() { cut -d' ' -f1-3 /proc/loadavg; }

pg_bin=/usr/lib/postgresql/15/bin
if [ "${BENCH_PG_HOST:-}" = 1 ]; then
	# Postgres on the host, from Debian's package, not in a container: the
	# strongest ceiling this machine can build (pgbench in the container
	# reaches about half of what the same statement reaches here). Same
	# version, same durable defaults (fsync on, synchronous_commit on), the
	# same flags, run by the postgres user; its data in a directory of its own.
	[ -x "$pg_bin/postgres" ] || { sudo=; [ "$(id -u)" = 0 ] || sudo=sudo
		$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq postgresql-15 >/dev/null; }
	pgdata="$work/pgdata"; mkdir -p "$pgdata"; chown postgres:postgres "$work" "$pgdata"
	as_pg() { setpriv --reuid=postgres --regid=postgres --init-groups "$@"; }
	printf bench >"$work/pw"; chown postgres "$work/pw"
	as_pg "$pg_bin/initdb" -U tokengate --pwfile="$work/pw" --auth-local=trust --auth-host=scram-sha-256 -E UTF8 -D "$pgdata" >/dev/null
	as_pg "$pg_bin/pg_ctl" -D "$pgdata" -l "$work/pg.log" -w \
		-o "-p $port -k $work -c listen_addresses=127.0.0.1 -c max_connections=300 ${BENCH_PG_FLAGS:-}" start >/dev/null
	as_pg "$pg_bin/createdb" -h "$work" -p "$port" -U tokengate tokengate
	url="postgres://tokengate:bench@127.0.0.1:$port/tokengate?sslmode=disable"
	pg_host_stop() { as_pg "$pg_bin/pg_ctl" -D "$pgdata" -m immediate -w stop >/dev/null 2>&1 || true; }
	psql_pg() { PGPASSWORD=bench command psql -q -h 127.0.0.1 -p "$port" -U tokengate -d tokengate "$@"; }
	postmaster=$(head -1 "$pgdata/postmaster.pid")
	pg_cpu_ns() { # the postmaster, its live children, and the children it reaped (cutime, cstime)
		local total=0 f p
		read -r -a f <"/proc/$postmaster/stat"
		total=$(( f[13] + f[14] + f[15] + f[16] ))
		for p in $(pgrep -P "$postmaster"); do
			read -r -a f 2>/dev/null <"/proc/$p/stat" || continue
			total=$(( total + f[13] + f[14] ))
		done
		echo $(( total * 1000000000 / $(getconf CLK_TCK) ))
	}
else
	docker rm -f "$pg" >/dev/null 2>&1 || true
	docker run -d --name "$pg" --shm-size=1g -p 127.0.0.1:$port:5432 \
		-e POSTGRES_USER=tokengate -e POSTGRES_PASSWORD=bench -e POSTGRES_DB=tokengate \
		"$image" -c max_connections=300 ${BENCH_PG_FLAGS:-} >/dev/null
	# Clients reach Postgres at the container's own address on Docker's bridge,
	# not through the published port: that port is served by docker-proxy, a
	# userland copy of every byte (about 20 µs of CPU per admission that neither
	# side's figures counted, on the cores both share). Redis, the peer's
	# store, is on loopback with no proxy either.
	pg_ip=$(docker inspect -f '{{.NetworkSettings.IPAddress}}' "$pg")
	url="postgres://tokengate:bench@$pg_ip:5432/tokengate?sslmode=disable"
	for _ in $(seq 60); do docker exec "$pg" pg_isready -U tokengate -d tokengate >/dev/null 2>&1 && break; sleep 1; done
	sleep 2
	cgroup="/sys/fs/cgroup/cpuacct/docker/$(docker inspect -f '{{.Id}}' "$pg")/cpuacct.usage"
	pg_cpu_ns() { cat "$cgroup" 2>/dev/null || echo 0; }
	pg_host_stop() { :; }
	psql_pg() { docker exec -i "$pg" psql -q -U tokengate -d tokengate "$@"; }
fi
proc_cpu_ns() { # the CPU of processes, in ns (utime + stime)
	local total=0
	for p in "$@"; do
		read -r -a f < "/proc/$p/stat"
		total=$((total + (f[13] + f[14]) * 1000000000 / $(getconf CLK_TCK)))
	done
	echo "$total"
}

# tokengate: tenants whose limits never refuse, so that what is measured
# is the cost of deciding. LEASE=auto puts each of them in lease mode auto
# (quota leasing, docs/leasing.md): the replicas admit their requests from
# leases, journaled, and take their row locks only to renew. A request with
# an Idempotency-Key is still decided exactly by the wiring, so the rate
# limit service's traffic, which keys every reservation by its request id,
# and loadgen --idempotency-keys stay exact.
# lease_paths shows which path decided (tokengate_admission_paths_total,
# tokengate_settle_paths_total).
export TOKENGATE_DATABASE_URL="$url"
"$bin" migrate --wait 30s 2>/dev/null
lease="${LEASE:-}"
mk() {
	"$bin" tenant create "$1" --tokens-capacity 1000000000000 --tokens-per-second 1000000000 >/dev/null 2>&1 &&
		{ [ -z "$lease" ] || "$bin" tenant update "$1" --lease "$lease" >/dev/null 2>&1; } &&
		"$bin" key create "$1" 2>/dev/null
}
hot_key=$(mk hot)
spread_keys=()
for i in $(seq -w 1 64); do spread_keys+=(--key "$(mk "t$i")"); done

# analyze brings the tables' statistics up to what the warm-up wrote, as
# autovacuum does within its first minute on a live database. Without it,
# statements prepared while the tables were empty keep plans made for
# empty tables (a hash join over all of idempotency_keys, say) for the whole
# of a 15 s run, and the figures depend on when each connection planned.
analyze() { psql_pg -c ANALYZE; }

# warm drives each replica (base URLs) for a few seconds with every load,
# so that the tables hold rows, then analyzes.
warm() {
	for u in "$@"; do
		"$bin" loadgen --concurrency "$clients" --duration 2s --url "$u" --key "$hot_key" --settle >/dev/null
		"$bin" loadgen --concurrency "$clients" --duration 2s --url "$u" "${spread_keys[@]}" --no-settle >/dev/null
	done
	analyze
}

serve() { # port [flags] -> pid
	local p="$1"; shift
	"$bin" serve --addr "127.0.0.1:$p" --log-level error ${BENCH_SERVE_FLAGS:-} "$@" >"$work/serve-$p.log" 2>&1 &
	echo $!
}
ready() { # no curl on a bare machine: HTTP/1.0 over bash's /dev/tcp
	{ exec 3<>"/dev/tcp/127.0.0.1/$1"; } 2>/dev/null || return 1
	printf 'GET /readyz HTTP/1.0\r\n\r\n' >&3
	local status; read -r _ status _ <&3; exec 3<&-
	[ "$status" = 200 ]
}
lease_paths() { # http port -> the replica's decisions by path, on stderr (LEASE set)
	[ -n "$lease" ] || return 0
	{ exec 3<>"/dev/tcp/127.0.0.1/$1"; } 2>/dev/null || return 0
	printf 'GET /metrics HTTP/1.0\r\n\r\n' >&3
	say "replica :$1 (LEASE=$lease): $(grep -E '^tokengate_(admission|settle)_paths_total' <&3 | tr '\n' ' ')"
	exec 3<&-
}
wait_ready() { for _ in $(seq 100); do ready "$1" && return; sleep 0.1; done; cat "$work/serve-$1.log" >&2; exit 1; }
secs_of() { awk '{split($0, p, "m"); sub("s", "", p[2]); print p[1] * 60 + p[2]}' <<<"$1"; }
run() { # label pids... -- loadgen flags -> "adm/s p99_ms server_cpu_us pg_cpu_us rss_mb loadgen_cpu_us"
	local label="$1"; shift
	local sp=(); while [ "$1" != "--" ]; do sp+=("$1"); shift; done; shift
	local c0 s0; c0=$(pg_cpu_ns); s0=$(proc_cpu_ns "${sp[@]}")
	( "$bin" loadgen --json --concurrency "$clients" --duration "${secs}s" ${BENCH_LOADGEN_FLAGS:-} "$@" >"$work/load.json"; times >"$work/load.times" )
	local js; js=$(cat "$work/load.json")
	local lu ls; read -r lu ls < <(sed -n 2p "$work/load.times")
	local c1 s1; c1=$(pg_cpu_ns); s1=$(proc_cpu_ns "${sp[@]}")
	local rss=0; for p in "${sp[@]}"; do rss=$(( rss + $(awk '/VmHWM/ {print $2}' "/proc/$p/status") )); done
	local adm rate p99 errs
	adm=$(sed -n 's/.*"admitted":\([0-9]*\).*/\1/p' <<<"$js")
	rate=$(sed -n 's/.*"admits_per_second":\([0-9.e+]*\).*/\1/p' <<<"$js")
	p99=$(sed -n 's/.*"admit_latency":{[^}]*"p99_ns":\([0-9]*\).*/\1/p' <<<"$js")
	errs=$(sed -n 's/.*"errors":\([0-9]*\).*/\1/p' <<<"$js")
	[ "$errs" = 0 ] || say "$label: $errs errors"
	local lcpu; lcpu=$(awk -v u="$(secs_of "$lu")" -v s="$(secs_of "$ls")" -v n="$adm" 'BEGIN{printf "%d", (u + s) * 1e6 / n}')
	echo "$(awk -v r="$rate" 'BEGIN{printf "%.0f", r}') $(awk -v p="$p99" 'BEGIN{printf "%.1f", p/1e6}') $(( (s1 - s0) / 1000 / adm )) $(( (c1 - c0) / 1000 / adm )) $(( rss / 1024 )) $lcpu"
}
