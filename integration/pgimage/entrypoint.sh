#!/bin/bash
# Entrypoint for the locally built Postgres image. It follows the interface of
# the official postgres image (POSTGRES_USER, POSTGRES_PASSWORD, POSTGRES_DB,
# /docker-entrypoint-initdb.d) so that testcontainers-go's postgres module and
# `make run` work with it exactly as they would with postgres:16 from a registry.
set -Eeuo pipefail

# Arguments that start with '-' are flags for postgres.
if [ "${1:0:1}" = '-' ]; then
	set -- postgres "$@"
fi

if [ "$1" != 'postgres' ]; then
	exec "$@"
fi

if [ "$(id -u)" = '0' ]; then
	mkdir -p "$PGDATA" /var/run/postgresql
	chown -R postgres:postgres "$PGDATA" /var/run/postgresql
	chmod 700 "$PGDATA"
	chmod 2777 /var/run/postgresql
	# Drop root for good: initdb and postgres refuse to run as root anyway.
	exec setpriv --reuid=postgres --regid=postgres --init-groups "${BASH_SOURCE[0]}" "$@"
fi

if [ ! -s "$PGDATA/PG_VERSION" ]; then
	: "${POSTGRES_USER:=postgres}"
	: "${POSTGRES_DB:=$POSTGRES_USER}"
	if [ -z "${POSTGRES_PASSWORD:-}" ]; then
		echo >&2 'error: POSTGRES_PASSWORD is not set; the server would accept no TCP login'
		exit 1
	fi
	pwfile="$(mktemp)"
	printf '%s' "$POSTGRES_PASSWORD" >"$pwfile"
	initdb --username="$POSTGRES_USER" --pwfile="$pwfile" --auth-local=trust --auth-host=scram-sha-256 \
		--encoding=UTF8 -D "$PGDATA" ${POSTGRES_INITDB_ARGS:-}
	rm -f "$pwfile"
	printf '\nhost all all all scram-sha-256\n' >>"$PGDATA/pg_hba.conf"
	printf "\nlisten_addresses = '*'\n" >>"$PGDATA/postgresql.conf"

	# A temporary server without TCP, so nobody connects before setup is done.
	pg_ctl -D "$PGDATA" -o "-c listen_addresses='' -p 5432" -w start
	export PGUSER="$POSTGRES_USER" PGHOST=/var/run/postgresql PGPORT=5432
	if [ "$POSTGRES_DB" != 'postgres' ]; then
		psql -v ON_ERROR_STOP=1 --dbname postgres --set db="$POSTGRES_DB" <<-'SQL'
			CREATE DATABASE :"db";
		SQL
	fi
	for f in /docker-entrypoint-initdb.d/*; do
		[ -e "$f" ] || continue
		case "$f" in
		*.sh) echo "running $f"; . "$f" ;;
		*.sql) echo "running $f"; psql -v ON_ERROR_STOP=1 --dbname "$POSTGRES_DB" -f "$f" ;;
		*.sql.gz) echo "running $f"; gunzip -c "$f" | psql -v ON_ERROR_STOP=1 --dbname "$POSTGRES_DB" ;;
		*) echo "ignoring $f" ;;
		esac
	done
	pg_ctl -D "$PGDATA" -m fast -w stop
	unset PGUSER PGHOST PGPORT
	echo 'PostgreSQL init process complete; ready for start up.'
fi

exec "$@"
