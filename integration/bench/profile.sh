#!/usr/bin/env bash
# profile.sh: where a decision's cost goes, for one load of the rate limit
# service (the gRPC face bench-peer drives): Postgres's statements by
# execution time per LLM request (pg_stat_statements), its WAL per LLM
# request (pg_stat_wal), the CPU per LLM request of the server and of the
# Postgres container, and the server's CPU profile (pprof top). It is the
# profile BENCHMARKS.md's "what binds" sections are read from.
#
#   profile.sh            LOAD=spread-settle (hot, hot-settle, spread, spread-settle)
#   BENCH_SECONDS (15)  BENCH_CLIENTS (32)  BENCH_RLS_CONNS (2)  PG_IMAGE  TOKENGATE (bin/tokengate)  PPROF_KEEP (a file for the raw profile)
#   WAL (1: the load's WAL by record type, pg_waldump)
#   BEFORE ("hot hot-settle": loads the same server runs first, BENCH_SECONDS each, as bench-peer's one server does)
#   WARM_FIRST (1: warm up and analyze before the BEFORE loads, as bench-peer does)
#   BENCH_PG_NAME (tokengate-bench-profile-pg)  BENCH_PG_PORT (55435)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

load="${LOAD:-spread-settle}"
conns="${BENCH_RLS_CONNS:-2}"
export BENCH_PG_NAME="${BENCH_PG_NAME:-tokengate-bench-profile-pg}" BENCH_PG_PORT="${BENCH_PG_PORT:-55435}"
# pg_stat_statements ships with Postgres (contrib); planning is tracked too,
# so that a statement re-planned on every call would show.
export BENCH_PG_FLAGS="-c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all -c pg_stat_statements.track_planning=on"
tg_http=18380 tg_rls=18381 tg_pprof=18382

. integration/bench/lib.sh

tenants=(hot); spread=()
for i in $(seq -w 1 64); do tenants+=("t$i"); spread+=(--tenant "t$i"); done
flags_of() { # load -> its loadgen flags, in lf
	case $1 in
	hot) lf=(--tenant hot --no-settle) ;;
	hot-settle) lf=(--tenant hot --settle) ;;
	spread) lf=("${spread[@]}" --no-settle) ;;
	spread-settle) lf=("${spread[@]}" --settle) ;;
	*) say "profile: a load is hot, hot-settle, spread or spread-settle, not $1"; exit 2 ;;
	esac
}
for l in ${BEFORE:-}; do flags_of "$l"; done
flags_of "$load"
gateway=$("$bin" gateway create bench --tenants "$(IFS=,; echo "${tenants[*]}")" 2>/dev/null)
server=$(serve $tg_http --rls-addr 127.0.0.1:$tg_rls --pprof-addr 127.0.0.1:$tg_pprof); pids+=("$server")
wait_ready $tg_http
psql() { psql_pg "$@"; }
psql -c 'CREATE EXTENSION pg_stat_statements'
lg=(--concurrency "$clients" --rls-conns "$conns" --rls 127.0.0.1:$tg_rls --gateway "$gateway")
# BEFORE: the loads bench-peer's one server ran before this one, each for
# as long as this one runs; what they leave (leases, open admissions, the
# replica's memory) is then part of what is measured.
# WARM_FIRST=1 warms up and analyzes before the BEFORE loads, as bench-peer
# does (its statistics are then a few seconds of every load, not the
# measured load's after the others).
warm_up() { flags_of "$load"; "$bin" loadgen "${lg[@]}" "${lf[@]}" --duration 3s >/dev/null; analyze; }
[ "${WARM_FIRST:-}" != 1 ] || warm_up
for l in ${BEFORE:-}; do
	flags_of "$l"
	say "profile: $l first, ${secs} s"
	"$bin" loadgen "${lg[@]}" "${lf[@]}" --duration "${secs}s" >/dev/null
done

# The warm-up fills the tables, analyze brings their statistics to it (as
# lib.sh's warm does), then the counters start from zero.
[ "${WARM_FIRST:-}" = 1 ] || warm_up
flags_of "$load"
lg+=("${lf[@]}")
psql -c 'SELECT pg_stat_statements_reset()' -c "SELECT pg_stat_reset_shared('wal')" >/dev/null
# The tables' update counters before the load (not reset: autovacuum reads
# them), for the HOT share of each table's updates below.
psql -c 'CREATE TABLE bench_tabstat AS SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables' >/dev/null

lsn0=$(psql -tAc 'SELECT pg_current_wal_lsn()')
c0=$(pg_cpu_ns); s0=$(proc_cpu_ns "$server")
go tool pprof -proto -seconds "$((secs - 2))" "http://127.0.0.1:$tg_pprof/debug/pprof/profile" >"$work/cpu.pprof" 2>/dev/null &
prof=$!
# What Postgres's client backends wait on, sampled every 20 ms over the
# load from one session (pg_stat_activity is read afresh each sample, and
# each sample commits: a transaction held open over the load would keep
# every table's dead rows from being pruned, and slow what it measures): a
# decision that waits on a lock, a flush or its client shows there, where
# neither CPU nor statement times see it.
psql -c 'CREATE TABLE bench_waits (ev text, q text)' >/dev/null
psql -c "DO \$\$ BEGIN FOR i IN 1..$(((secs - 1) * 50)) LOOP
	PERFORM pg_stat_clear_snapshot();
	INSERT INTO bench_waits SELECT CASE WHEN state = 'idle' THEN 'idle' WHEN state = 'active' THEN coalesce(wait_event_type || ':' || wait_event, 'running') ELSE state || coalesce(' ' || wait_event_type || ':' || wait_event, '') END,
		left(regexp_replace(regexp_replace(query, '--[^\n]*\n', '', 'g'), '\s+', ' ', 'g'), 60)
		FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() AND datname = 'tokengate';
	COMMIT;
	PERFORM pg_sleep(0.02);
END LOOP; END \$\$" >/dev/null &
waits=$!
"$bin" loadgen --json "${lg[@]}" --duration "${secs}s" >"$work/load.json"
c1=$(pg_cpu_ns); s1=$(proc_cpu_ns "$server")
lsn1=$(psql -tAc 'SELECT pg_current_wal_lsn()')
wait "$prof" || say "profile: no CPU profile"
wait "$waits" || say "profile: no wait samples"
lease_paths $tg_http
js=$(cat "$work/load.json")
num() { sed -n "s/.*\"$1\":\([0-9.e+]*\).*/\1/p" <<<"$js"; }
adm=$(num admitted)
[ "${adm:-0}" -gt 0 ] || { say "profile: admitted nothing: $js"; exit 1; }
echo "load $load, $clients callers over $conns connections, ${secs} s; load average $(loadavg)"
awk -v d="$(num duration_ns)" -v a="$adm" -v n="$(num settled)" -v r="$(num requests)" -v s="$((s1 - s0))" -v c="$((c1 - c0))" \
	'BEGIN{printf "calls/s %.0f, LLM requests/s %.0f; CPU us per LLM request: server %.0f, Postgres %.0f\n", (r + n) / (d / 1e9), a / (d / 1e9), s / 1000 / a, c / 1000 / a}'
echo
echo "Postgres statements, by execution time per LLM request:"
psql -c "SELECT round((total_exec_time * 1000 / $adm)::numeric, 1) AS exec_us_per_req,
	round((total_plan_time * 1000 / $adm)::numeric, 1) AS plan_us_per_req, calls, rows,
	round(rows::numeric / $adm, 2) AS rows_per_req,
	left(regexp_replace(regexp_replace(query, '--[^\n]*\n', '', 'g'), '\s+', ' ', 'g'), 70) AS statement
	FROM pg_stat_statements WHERE query NOT LIKE '%pg_stat%' AND query NOT LIKE '%pg_sleep%' ORDER BY total_exec_time DESC LIMIT 15"
psql -c "SELECT round(wal_records::numeric / $adm, 1) AS wal_records_per_req, round(wal_bytes / $adm) AS wal_bytes_per_req,
	wal_fpi AS full_page_images FROM pg_stat_wal"
# WAL=1: what the load's WAL is made of, by record type (pg_waldump
# --stats=record over the load's range of the log; the wait sampler's own
# inserts are among it, a few records per 20 ms): which rows, index entries
# and full-page images each LLM request writes.
if [ "${WAL:-}" = 1 ]; then
	echo "The load's WAL by record type (pg_waldump; count and bytes per LLM request):"
	if [ "${BENCH_PG_HOST:-}" = 1 ]; then
		dump=$(as_pg "$pg_bin/pg_waldump" --stats=record -p "$pgdata/pg_wal" -s "$lsn0" -e "$lsn1" 2>&1 || true)
	else
		dump=$(docker exec -u postgres "$pg" sh -c "/usr/lib/postgresql/15/bin/pg_waldump --stats=record -p \"\$PGDATA/pg_wal\" -s $lsn0 -e $lsn1" 2>&1 || true)
	fi
	awk -v a="$adm" '{ l = $0; gsub(/\([^)]*\)/, "", l); n = split(l, f, " ")
		if (n == 5 && f[2] ~ /^[0-9]+$/ && f[2] > 0) printf "  %-40s %7.2f rec %8.0f B\n", f[1], f[2] / a, f[5] / a }' <<<"$dump" | sort -k4 -n -r | head -15
	echo "... and by relation (records per LLM request, the first block each names):"
	if [ "${BENCH_PG_HOST:-}" = 1 ]; then
		recs=$(as_pg "$pg_bin/pg_waldump" -p "$pgdata/pg_wal" -s "$lsn0" -e "$lsn1" 2>/dev/null || true)
	else
		recs=$(docker exec -u postgres "$pg" sh -c "/usr/lib/postgresql/15/bin/pg_waldump -p \"\$PGDATA/pg_wal\" -s $lsn0 -e $lsn1" 2>/dev/null || true)
	fi
	names=$(psql -tA -F' ' -c "SELECT relfilenode, relname FROM pg_class WHERE relfilenode <> 0")
	awk -v a="$adm" 'NR == FNR { name[$1] = $2; next }
		match($0, /desc: [A-Z_+0-9]+/) { d = substr($0, RSTART + 6, RLENGTH - 6)
			r = "-"; if (match($0, /rel [0-9]+\/[0-9]+\/[0-9]+/)) { split(substr($0, RSTART + 4, RLENGTH - 4), p, "/"); r = (p[3] in name) ? name[p[3]] : p[3] }
			c[$2 "/" d " " r]++ }
		END { for (k in c) if (c[k] / a >= 0.01) printf "  %-60s %7.2f\n", k, c[k] / a }' <(echo "$names") <(echo "$recs") | sort -k3 -n -r | head -25
fi
# Updates that are not HOT write a new entry in every index of their table:
# each table's writes per LLM request over the load, and the HOT share.
sleep 1 # backends flush their table counters at least every second
echo "Rows written per LLM request, by table (updates: the share that were HOT):"
psql -c "SELECT t.relname AS table, round((t.n_tup_ins - b.n_tup_ins)::numeric / $adm, 2) AS inserts,
	round((t.n_tup_upd - b.n_tup_upd)::numeric / $adm, 2) AS updates,
	round(100 * (t.n_tup_hot_upd - b.n_tup_hot_upd)::numeric / nullif(t.n_tup_upd - b.n_tup_upd, 0)) AS hot_pct
	FROM pg_stat_user_tables t JOIN bench_tabstat b USING (relname)
	WHERE t.n_tup_ins + t.n_tup_upd > b.n_tup_ins + b.n_tup_upd AND t.relname NOT LIKE 'bench_%' ORDER BY 2 DESC, 3 DESC"
echo "What Postgres's client backends were doing, sampled every 20 ms (samples: per sample, how many backends):"
psql -c "SELECT ev AS waiting_on, q AS statement, round(count(*)::numeric / $(((secs - 1) * 50)), 2) AS backends
	FROM bench_waits WHERE ev <> 'idle' GROUP BY 1, 2 ORDER BY 3 DESC LIMIT 15"
psql -c "SELECT ev, round(count(*)::numeric / $(((secs - 1) * 50)), 2) AS backends FROM bench_waits GROUP BY 1 ORDER BY 2 DESC LIMIT 10"
echo "The server's CPU (pprof, cumulative, top 25):"
go tool pprof -top -cum -nodecount 25 "$bin" "$work/cpu.pprof" 2>/dev/null | tail -n +5
# PPROF_KEEP=FILE keeps the profile, to read further (go tool pprof).
[ -z "${PPROF_KEEP:-}" ] || cp "$work/cpu.pprof" "$PPROF_KEEP"
