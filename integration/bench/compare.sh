#!/usr/bin/env bash
# compare.sh: tokengate against Postgres's own ceiling, in one run, on one
# durable Postgres (fsync on, synchronous_commit on), with the same number of
# clients. pgbench runs the cheapest possible admission (one UPDATE ..
# RETURNING and a ledger INSERT, one statement and one commit per
# admission); tokengate is driven over HTTP by its load generator. Each pair
# is printed with its ratio and both p99s, and the CPU each side used per
# admission.
#
#   BENCH_SECONDS (15)  BENCH_CLIENTS (32)  PG_IMAGE  TOKENGATE (bin/tokengate)
#   SPREAD_ROUNDS=N: only the 64-tenant admit-only pair (issue 39's HTTP
#   must), N rounds, each pgbench's ceiling then tokengate on one replica,
#   one after the other, and the median of the rounds' ratios: this
#   machine's ceiling moves by up to half between runs minutes apart, so a
#   ratio is read within its round.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

. integration/bench/lib.sh

p99_us() { sort -n | awk '{a[NR]=$1} END {i=int(NR*0.99); if (i<1) i=1; print a[i]}'; }

psql_pg < integration/bench/pgbench_schema.sql
[ -n "${BENCH_PG_HOST:-}" ] || docker cp integration/bench/admission.pgbench "$pg":/tmp/admission.pgbench >/dev/null
command -v pgbench >/dev/null || { sudo=; [ "$(id -u)" = 0 ] || sudo=sudo
	$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq postgresql-client-15 >/dev/null; }

# pgbench, two ways: inside the Postgres container (no network between them,
# but its client shares the container's cgroup and namespace), and from the
# host over TCP as tokengate connects. The ratio is over the stronger of
# the two: the strongest ceiling this machine builds for the statement.
pgbench_in() { # tenants -> output; inside the container
	docker exec "$pg" sh -c 'rm -f /tmp/pgb_log*'
	docker exec -w /tmp "$pg" pgbench -U tokengate -d tokengate -n -c "$clients" -j 2 -T "$secs" \
		-f /tmp/admission.pgbench -D tenants="$1" -l --log-prefix=/tmp/pgb_log 2>&1
	docker exec "$pg" sh -c 'cat /tmp/pgb_log*' >"$work/pgb.lat"
}
pgbench_host() { # tenants -> output; from the host
	rm -f "$work"/pgb_log*
	(cd "$work" && PGPASSWORD=bench command pgbench "$url" -n -c "$clients" -j 2 -T "$secs" \
		-f "$OLDPWD/integration/bench/admission.pgbench" -D tenants="$1" -l --log-prefix=pgb_log 2>&1)
	cat "$work"/pgb_log* >"$work/pgb.lat"
}
pgbench() { # where tenants -> "tps p99_ms pg_cpu_us_per_admission"
	local c0; c0=$(pg_cpu_ns)
	local out
	out=$("pgbench_$1" "$2")
	local c1; c1=$(pg_cpu_ns)
	local tps; tps=$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' <<<"$out" | head -1)
	local n; n=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' <<<"$out")
	local p99; p99=$(awk '{print $3}' "$work/pgb.lat" | p99_us)
	echo "$(awk -v t="$tps" 'BEGIN{printf "%.0f", t}') $(awk -v u="$p99" 'BEGIN{printf "%.1f", u/1000}') $(( (c1 - c0) / 1000 / n ))"
}
stronger() { # two "tps p99 cpu" lines (the second may be empty) -> the one of higher tps
	if [ -z "$2" ] || [ "${1%% *}" -ge "${2%% *}" ]; then echo "$1"; else echo "$2"; fi
}
if [ -n "${BENCH_PG_HOST:-}" ]; then where="Postgres on the host"; else where="Postgres in a container"; fi
if [ -n "${SPREAD_ROUNDS:-}" ]; then
	s1=$(serve 18080); pids+=("$s1"); wait_ready 18080
	warm http://127.0.0.1:18080
	echo "| round | pgbench ceiling, 64 tenants (adm/s) | tokengate, one replica, 64 tenants (adm/s, p99) | ratio | tokengate CPU us/adm | Postgres CPU us/adm | load generator CPU us/adm |"
	echo "|---|---|---|---|---|---|---|"
	: >"$work/ratios"
	for i in $(seq "$SPREAD_ROUNDS"); do
		ceiling=$(pgbench host 64)
		[ -n "${BENCH_PG_HOST:-}" ] || ceiling=$(stronger "$ceiling" "$(pgbench in 64)")
		read -r tg tg_p99 tg_cpu tg_pg _ tg_lg <<<"$(run spread "$s1" -- --url http://127.0.0.1:18080 "${spread_keys[@]}" --no-settle)"
		r=$(div "$tg" "${ceiling%% *}"); echo "$r" >>"$work/ratios"
		echo "| $i | ${ceiling%% *} | $tg ($tg_p99 ms) | ${r}x | $tg_cpu | $tg_pg | $tg_lg |"
	done
	lease_paths 18080
	echo
	echo "median ratio over $SPREAD_ROUNDS rounds: $(median <"$work/ratios")x ($clients clients, ${secs} s per run, $where, $(nproc) cores; load average $(loadavg))"
	exit 0
fi
say "pgbench: $clients clients, ${secs}s each, $where"
hot_host=$(pgbench host 1); spread_host=$(pgbench host 64)
hot_in=; spread_in=
if [ -z "${BENCH_PG_HOST:-}" ]; then hot_in=$(pgbench in 1); spread_in=$(pgbench in 64); fi
read -r pg_hot_tps pg_hot_p99 pg_hot_cpu <<<"$(stronger "$hot_host" "$hot_in")"
read -r pg_spread_tps pg_spread_p99 pg_spread_cpu <<<"$(stronger "$spread_host" "$spread_in")"
say "pgbench admissions/s, one hot tenant: from the host ${hot_host%% *}, inside the container ${hot_in%% *}; 64 tenants: from the host ${spread_host%% *}, inside the container ${spread_in%% *}"


say "tokengate: one replica"
s1=$(serve 18080); pids+=("$s1"); wait_ready 18080
warm http://127.0.0.1:18080
read -r tg_hot tg_hot_p99 tg_hot_cpu tg_hot_pg tg_hot_rss tg_hot_lg <<<"$(run hot "$s1" -- --url http://127.0.0.1:18080 --key "$hot_key" --no-settle)"
read -r tg_spread tg_spread_p99 tg_spread_cpu tg_spread_pg tg_spread_rss tg_spread_lg <<<"$(run spread "$s1" -- --url http://127.0.0.1:18080 "${spread_keys[@]}" --no-settle)"
read -r tg_settle tg_settle_p99 tg_settle_cpu tg_settle_pg tg_settle_rss tg_settle_lg <<<"$(run settle "$s1" -- --url http://127.0.0.1:18080 --key "$hot_key" --settle)"
lease_paths 18080
kill "$s1"; wait "$s1" 2>/dev/null || true; pids=()

say "tokengate: four replicas"
four=(); urls=()
for p in 18081 18082 18083 18084; do
	pid=$(serve $p --max-conns 8 --replica-id "r$p"); pids+=("$pid"); four+=("$pid"); urls+=(--url "http://127.0.0.1:$p")
done
for p in 18081 18082 18083 18084; do wait_ready $p; done
read -r r4_hot r4_hot_p99 r4_hot_cpu r4_hot_pg r4_hot_rss r4_hot_lg <<<"$(run hot4 "${four[@]}" -- "${urls[@]}" --key "$hot_key" --no-settle)"
read -r r4_spread r4_spread_p99 r4_spread_cpu r4_spread_pg r4_spread_rss r4_spread_lg <<<"$(run spread4 "${four[@]}" -- "${urls[@]}" "${spread_keys[@]}" --no-settle)"
read -r r4_settle r4_settle_p99 r4_settle_cpu r4_settle_pg r4_settle_rss r4_settle_lg <<<"$(run settle4 "${four[@]}" -- "${urls[@]}" --key "$hot_key" --settle)"
for p in 18081 18082 18083 18084; do lease_paths $p; done

ratio() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2fx", a/b}'; }
cat <<TABLE

$clients clients, ${secs} s per run, durable commits, $where; pgbench the stronger of its runs from the host and inside the container (stderr); $(nproc) cores shared by Postgres, tokengate and the load.
CPU is microseconds per admission: tokengate's server processes, Postgres (pgbench's own in brackets), the load generator.

| load | tokengate admissions/s (p99) | pgbench per-admission ceiling (p99) | ratio | tokengate CPU us/adm | Postgres CPU us/adm (pgbench's) | load generator CPU us/adm | peak RSS |
|---|---|---|---|---|---|---|---|
| one hot tenant, admit only | $tg_hot ($tg_hot_p99 ms) | $pg_hot_tps ($pg_hot_p99 ms) | $(ratio "$tg_hot" "$pg_hot_tps") | $tg_hot_cpu | $tg_hot_pg ($pg_hot_cpu) | $tg_hot_lg | $tg_hot_rss MB |
| 64 tenants, admit only | $tg_spread ($tg_spread_p99 ms) | $pg_spread_tps ($pg_spread_p99 ms) | $(ratio "$tg_spread" "$pg_spread_tps") | $tg_spread_cpu | $tg_spread_pg ($pg_spread_cpu) | $tg_spread_lg | $tg_spread_rss MB |
| one hot tenant, admit + settle | $tg_settle ($tg_settle_p99 ms) | $pg_hot_tps ($pg_hot_p99 ms) | $(ratio "$tg_settle" "$pg_hot_tps") | $tg_settle_cpu | $tg_settle_pg | $tg_settle_lg | $tg_settle_rss MB |
| 4 replicas, one hot tenant, admit only | $r4_hot ($r4_hot_p99 ms) | $pg_hot_tps | $(ratio "$r4_hot" "$pg_hot_tps") | $r4_hot_cpu | $r4_hot_pg | $r4_hot_lg | $r4_hot_rss MB (4) |
| 4 replicas, 64 tenants, admit only | $r4_spread ($r4_spread_p99 ms) | $pg_spread_tps | $(ratio "$r4_spread" "$pg_spread_tps") | $r4_spread_cpu | $r4_spread_pg | $r4_spread_lg | $r4_spread_rss MB (4) |
| 4 replicas, one hot tenant, admit + settle | $r4_settle ($r4_settle_p99 ms) | $pg_hot_tps | $(ratio "$r4_settle" "$pg_hot_tps") | $r4_settle_cpu | $r4_settle_pg | $r4_settle_lg | $r4_settle_rss MB (4) |
TABLE
