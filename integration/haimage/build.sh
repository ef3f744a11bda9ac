#!/usr/bin/env bash
# build.sh IMAGE builds the high-availability image from Debian packages, with
# no registry, the way integration/pgimage/build.sh builds the Postgres one:
# debootstrap a minimal bookworm with postgresql-15, patroni, etcd-server and
# the Python packages Patroni's etcd3 support imports, trim it, add the
# entrypoint, and `docker import` it. One image serves both roles: `etcd` runs a
# one-member etcd, `patroni` a Postgres node under Patroni (see entrypoint.sh).
set -euo pipefail

image="${1:?usage: build.sh IMAGE}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo"

if ! command -v debootstrap >/dev/null 2>&1; then
	$sudo apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq debootstrap >/dev/null
fi

mirror="$(grep -hs '^URIs:' /etc/apt/sources.list.d/* | awk '{print $2}' | grep -E '/debian/?$' | head -n1 || true)"
if [ -z "$mirror" ]; then
	mirror="$(grep -hs '^deb ' /etc/apt/sources.list | awk '{print $2}' | grep -E '/debian/?$' | head -n1 || true)"
fi
mirror="${mirror:-http://deb.debian.org/debian}"

work="$(mktemp -d /tmp/haimage.XXXXXX)"
root="$work/rootfs"
trap '$sudo rm -rf "$work"' EXIT

# Patroni 3.0's etcd3 client speaks etcd's v3 JSON gateway over urllib3, but
# its module imports the v2 one, which imports python-etcd: python3-etcd is
# needed even though the v2 API is never used. Named here rather than left to
# debootstrap's choice among patroni's alternative dependencies.
packages=postgresql-15,patroni,python3-psycopg2,python3-etcd,etcd-server
echo "ha-image: debootstrap bookworm with $packages from $mirror (one to four minutes)"
$sudo debootstrap --variant=minbase --include="$packages" bookworm "$root" "$mirror" >"$work/debootstrap.log" 2>&1 || {
	tail -n 50 "$work/debootstrap.log" >&2
	exit 1
}

# Fail here, not at the first failover, if a module Patroni needs is missing.
$sudo chroot "$root" python3 -c 'import patroni.dcs.etcd3, psycopg2' || {
	echo "ha-image: patroni's etcd3 support does not import" >&2
	exit 1
}

$sudo chroot "$root" apt-get clean
$sudo rm -rf "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* "$root"/usr/share/man/* \
	"$root"/usr/share/info/* "$root"/etc/postgresql/15 "$root"/var/lib/postgresql/15 \
	"$root"/var/lib/etcd/* "$root"/var/cache/debconf/*-old "$root"/var/log/*.log
$sudo install -m 0755 "$here/entrypoint.sh" "$root/usr/local/bin/ha-entrypoint.sh"
$sudo install -m 0755 "$here/post-bootstrap.sh" "$root/usr/local/bin/ha-post-bootstrap.sh"
$sudo mkdir -p "$root/var/lib/postgresql/data" "$root/var/run/postgresql" "$root/var/lib/etcd"

base="${image}-base"
$sudo tar -C "$root" -c . | docker import \
	--change 'ENV PATH=/usr/lib/postgresql/15/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
	--change 'ENV LANG=C.UTF-8' \
	--change 'ENTRYPOINT ["/usr/local/bin/ha-entrypoint.sh"]' \
	--change 'CMD ["patroni"]' \
	--change 'EXPOSE 5432 8008 2379' \
	- "$base" >/dev/null

# docker.io 20.10's import refuses STOPSIGNAL; a two-line build sets it offline.
# SIGTERM stops Patroni, which stops Postgres (fast) and releases the leader key.
printf 'FROM %s\nSTOPSIGNAL SIGTERM\n' "$base" | docker build -q -t "$image" - >/dev/null
docker rmi "$base" >/dev/null
echo "ha-image: built $image"
