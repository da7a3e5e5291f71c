#!/usr/bin/env bash
# Runs every benchmark binary in BUILD_DIR/bench (as `make bench` builds them) and prints
# their tables, one after the other.  Arguments after BUILD_DIR are passed to each.
# Exit status: 1 when any benchmark failed (the others still run).
set -u
build=${1:-build}
shift || true
status=0
found=0
for b in "$build"/bench/*; do
    [ -f "$b" ] && [ -x "$b" ] || continue
    found=1
    echo "== $(basename "$b") =="
    if ! "$b" "$@"; then
        echo "$(basename "$b"): FAILED" >&2
        status=1
    fi
    echo
done
if [ "$found" -eq 0 ]; then
    echo "no benchmarks in $build/bench (run 'make bench')" >&2
    exit 1
fi
exit "$status"
