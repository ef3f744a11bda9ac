#!/usr/bin/env bash
# experiment.sh: builds a tokengate binary with one of the upper-bound
# experiments of BENCHMARKS.md ("Quota leasing, seventh step") applied to
# this checkout's HEAD. Each is a patch in integration/bench/experiment/
# that leaves out part of the lease journal's work, so it is NOT correct:
# it only bounds what that part costs, measured side by side against the
# same HEAD without it (side.sh) or against the peer (peer.sh, TOKENGATE=).
#
#   experiment.sh NAME [OUT (/tmp/tokengate-NAME)]
#   NAME: floor, floor-keys, no-lease-use, no-lease-use-two-in-flight, no-keys,
#         no-booking-entries, two-indexes-dropped, compact-bound (the compact
#         design without its reads: a record per group for its admissions and
#         one for its ends, the keys, the lease use; no admissions rows),
#         compact-gin (compact-bound with the keys in the group's row, found
#         through a GIN index, fastupdate off, read under their advisory
#         locks: no key rows), compact-group-use (compact-bound with the lease
#         use as one row write per group: the leases read, not updated)
#
# The patches were made against the commit that added them; a later change
# to the lines they touch makes git apply refuse, and says which.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
name="${1:?experiment.sh NAME [OUT]; NAME is one of: $(cd integration/bench/experiment && ls ./*.patch | sed 's|^\./||; s|\.patch$||' | tr '\n' ' ')}"
patch="$PWD/integration/bench/experiment/$name.patch"
[ -r "$patch" ] || { echo "experiment: no $patch" >&2; exit 2; }
out="${2:-/tmp/tokengate-$name}"
case "$out" in /*) ;; *) out="$PWD/$out" ;; esac
tree="$(mktemp -d /tmp/experiment.XXXXXX)"
trap 'git worktree remove --force "$tree" >/dev/null 2>&1 || rm -rf "$tree"' EXIT
git worktree add -q --detach "$tree" HEAD
git -C "$tree" apply "$patch"
(cd "$tree" && CGO_ENABLED=0 go build -o "$out" ./cmd/tokengate)
echo "experiment: $name built at $out (HEAD $(git rev-parse --short HEAD) with $patch applied; not correct, a bound only)" >&2
echo "$out"
