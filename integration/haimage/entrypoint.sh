#!/bin/bash
# Entrypoint of the high-availability image (tc.local/patroni:15-bookworm).
# One image, two roles, chosen by the first argument:
#
#   etcd      a one-member etcd 3.4 (client port 2379), the store of Patroni's
#             leader key. Data in /var/lib/etcd.
#   patroni   a Postgres 15 node under Patroni 3.0 (Postgres on 5432, REST API
#             on 8008), configured from the environment below. The first node
#             to take the leader key runs initdb and creates the application's
#             database and role; the others clone it with pg_basebackup.
#   other     run as a command (a shell, patronictl, psql).
#
# The patroni role's environment (HA_*, not PATRONI_*, which Patroni itself
# reads and would apply on top of the file):
#   HA_NAME                  the member's name (default: the hostname)
#   HA_SCOPE                 the cluster's name in etcd (default: tokengate)
#   HA_CONNECT_HOST          where the other nodes reach this one (default: its IP)
#   HA_ETCD_HOSTS            etcd's client endpoints, host:port[,...] (default: etcd:2379)
#   HA_SUPERUSER_PASSWORD    the postgres role's password (required)
#   HA_REPLICATION_PASSWORD  the replicator role's password (required)
#   HA_DB, HA_DB_USER        the application's database and its owner (default: tokengate)
#   HA_DB_PASSWORD           the owner's password (required)
#   HA_HBA_NETWORK           who may connect over TCP (default: samenet, any
#                            address on a network this container is on, which
#                            is the Docker network and its gateway)
# Passwords must not contain a single quote (they go into YAML and SQL quoted).
set -Eeuo pipefail

role="${1:-patroni}"

myip() { hostname -i | awk '{print $1}'; }

case "$role" in
etcd)
	host="${ETCD_ADVERTISE_HOST:-$(myip)}"
	name="${ETCD_NAME:-etcd}"
	# Patroni asks etcd for its members' client URLs and talks to those, so
	# the advertised URL must be reachable from the other containers.
	exec etcd --name "$name" --data-dir /var/lib/etcd/data \
		--listen-client-urls http://0.0.0.0:2379 --advertise-client-urls "http://$host:2379" \
		--listen-peer-urls http://0.0.0.0:2380 --initial-advertise-peer-urls "http://$host:2380" \
		--initial-cluster "$name=http://$host:2380" --initial-cluster-state new \
		--initial-cluster-token tokengate-ha
	;;
patroni) ;;
*) exec "$@" ;;
esac

if [ "$(id -u)" = '0' ]; then
	mkdir -p /var/lib/postgresql/data /var/run/postgresql
	chown -R postgres:postgres /var/lib/postgresql /var/run/postgresql
	chmod 700 /var/lib/postgresql/data
	chmod 2777 /var/run/postgresql
	# Patroni and Postgres run as postgres; initdb refuses root anyway.
	exec setpriv --reuid=postgres --regid=postgres --init-groups "${BASH_SOURCE[0]}" "$@"
fi

for v in HA_SUPERUSER_PASSWORD HA_REPLICATION_PASSWORD HA_DB_PASSWORD; do
	if [ -z "${!v:-}" ]; then
		echo >&2 "error: $v is not set"
		exit 1
	fi
done
: "${HA_NAME:=$(hostname)}"
: "${HA_SCOPE:=tokengate}"
: "${HA_CONNECT_HOST:=$(myip)}"
: "${HA_ETCD_HOSTS:=etcd:2379}"
: "${HA_DB:=tokengate}"
: "${HA_DB_USER:=tokengate}"
: "${HA_HBA_NETWORK:=samenet}"
export HA_DB HA_DB_USER HA_DB_PASSWORD # read by ha-post-bootstrap.sh

# Why these settings:
# - ttl 10, loop_wait 2, retry_timeout 4 (loop_wait + 2 x retry_timeout <= ttl,
#   as Patroni requires): a dead primary's leader key expires within 10 s, so a
#   failover takes seconds, not the default 30.
# - synchronous_mode: a commit is acknowledged once it is on the primary and
#   on the synchronous standby, and only that standby may be promoted, so no
#   acknowledged commit is lost when the primary dies.
# - use_pg_rewind (wal_log_hints is on, and so are data checksums), and
#   removing the data directory when a rewind fails or timelines diverged: an
#   old primary that comes back rejoins as a replica of the new one, whatever
#   it wrote after the fork, instead of staying down.
# - maximum_lag_on_failover: a replica more than 1 MiB behind is not promoted.
cat >/tmp/patroni.yml <<YAML
scope: '${HA_SCOPE}'
namespace: /service/
name: '${HA_NAME}'
log:
  level: INFO
restapi:
  listen: 0.0.0.0:8008
  connect_address: '${HA_CONNECT_HOST}:8008'
etcd3:
  hosts: '${HA_ETCD_HOSTS}'
bootstrap:
  dcs:
    ttl: 10
    loop_wait: 2
    retry_timeout: 4
    maximum_lag_on_failover: 1048576
    synchronous_mode: true
    postgresql:
      use_pg_rewind: true
      use_slots: true
      remove_data_directory_on_rewind_failure: true
      remove_data_directory_on_diverged_timelines: true
      parameters:
        wal_level: replica
        hot_standby: 'on'
        wal_log_hints: 'on'
        max_connections: 200
        max_wal_senders: 10
        max_replication_slots: 10
        wal_keep_size: 256MB
        password_encryption: scram-sha-256
  initdb:
    - encoding: UTF8
    - locale: C.UTF-8
    - data-checksums
  post_bootstrap: /usr/local/bin/ha-post-bootstrap.sh
postgresql:
  listen: 0.0.0.0:5432
  connect_address: '${HA_CONNECT_HOST}:5432'
  data_dir: /var/lib/postgresql/data
  bin_dir: /usr/lib/postgresql/15/bin
  pgpass: /tmp/pgpass
  # A new replica's pg_basebackup asks for an immediate checkpoint, not a
  # spread one that would hold it for minutes on an idle primary.
  basebackup:
    - checkpoint: fast
  use_pg_rewind: true
  remove_data_directory_on_rewind_failure: true
  remove_data_directory_on_diverged_timelines: true
  authentication:
    superuser:
      username: postgres
      password: '${HA_SUPERUSER_PASSWORD}'
    replication:
      username: replicator
      password: '${HA_REPLICATION_PASSWORD}'
  pg_hba:
    - local all all trust
    - host replication replicator ${HA_HBA_NETWORK} scram-sha-256
    - host all all ${HA_HBA_NETWORK} scram-sha-256
    - host all all 127.0.0.1/32 scram-sha-256
  parameters:
    unix_socket_directories: /var/run/postgresql
tags:
  nofailover: false
  noloadbalance: false
  clonefrom: false
  nosync: false
YAML
chmod 600 /tmp/patroni.yml
exec patroni /tmp/patroni.yml
