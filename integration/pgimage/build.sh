#!/usr/bin/env bash
# build.sh IMAGE builds a Postgres 15 image from Debian packages, with no
# registry: debootstrap a minimal bookworm with postgresql-15, trim it, add an
# entrypoint compatible with the official image, and `docker import` it.
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

work="$(mktemp -d /tmp/pgimage.XXXXXX)"
root="$work/rootfs"
trap '$sudo rm -rf "$work"' EXIT

echo "pg-image: debootstrap bookworm from $mirror (about 3.5 minutes)"
$sudo debootstrap --variant=minbase --include=postgresql-15 bookworm "$root" "$mirror" >"$work/debootstrap.log" 2>&1 || {
	tail -n 50 "$work/debootstrap.log" >&2
	exit 1
}

$sudo chroot "$root" apt-get clean
$sudo rm -rf "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* "$root"/usr/share/man/* \
	"$root"/usr/share/info/* "$root"/etc/postgresql/15 "$root"/var/lib/postgresql/15 \
	"$root"/var/cache/debconf/*-old "$root"/var/log/*.log
$sudo install -m 0755 "$here/entrypoint.sh" "$root/usr/local/bin/docker-entrypoint.sh"
$sudo mkdir -p "$root/docker-entrypoint-initdb.d" "$root/var/lib/postgresql/data" "$root/var/run/postgresql"

base="${image}-base"
$sudo tar -C "$root" -c . | docker import \
	--change 'ENV PATH=/usr/lib/postgresql/15/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
	--change 'ENV PGDATA=/var/lib/postgresql/data' \
	--change 'ENV LANG=C.UTF-8' \
	--change 'ENTRYPOINT ["/usr/local/bin/docker-entrypoint.sh"]' \
	--change 'CMD ["postgres"]' \
	--change 'EXPOSE 5432' \
	--change 'VOLUME /var/lib/postgresql/data' \
	- "$base" >/dev/null

# docker.io 20.10's import refuses STOPSIGNAL; a two-line build sets it offline.
printf 'FROM %s\nSTOPSIGNAL SIGINT\n' "$base" | docker build -q -t "$image" - >/dev/null
docker rmi "$base" >/dev/null
echo "pg-image: built $image"
