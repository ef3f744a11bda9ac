#!/usr/bin/env bash
# fuzz.sh TARGET PACKAGE FUZZTIME: `go test -fuzz` of one target for a bounded
# time, as `make fuzz` runs each. A run that fails having written no failing
# input (PACKAGE/testdata/fuzz/TARGET) is Go's fuzzing coordinator racing its
# own -fuzztime deadline under CPU contention ("context deadline exceeded",
# no crasher; golang/go's coordinator compares the parent's and the
# child's context errors before the cancel reaches the child), not a
# finding: the target runs once more. A run that writes a failing input
# fails at once, and the input is kept for `go test` to replay.
set -uo pipefail
target="$1" pkg="$2" fuzztime="$3"
dir="${pkg%/}/testdata/fuzz/$target"
inputs() { find "$dir" -type f 2>/dev/null | wc -l; }
for attempt in 1 2; do
	before=$(inputs)
	go test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" "$pkg" && exit 0
	if [ "$(inputs)" != "$before" ]; then
		echo "fuzz: $target wrote a failing input to $dir" >&2
		exit 1
	fi
	[ "$attempt" = 1 ] && echo "fuzz: $target failed without a failing input (the -fuzztime deadline race); once more" >&2
done
exit 1
