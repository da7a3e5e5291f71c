#!/usr/bin/env bash
# Runs each fuzz target for SECONDS on a scratch copy of its seed corpus (the checked-in
# corpus stays as it is), FUZZ_JOBS targets at a time (default 2), and fails when any
# target reports a crash, leak, UB or timeout.  The mutation seed is fixed (FUZZ_SEED,
# default 1): a run explores the same inputs wherever it runs, as far as its time allows,
# so a CI failure is an input a longer local run with that seed meets too.
# usage: tests/fuzz/smoke.sh BUILD_DIR SECONDS fuzz_NAME...
set -uo pipefail
dir=$1 secs=$2
shift 2
here=$(cd "$(dirname "$0")" && pwd)
jobs_max=${FUZZ_JOBS:-2}
# Scratch files of the targets (fuzz_shard's manifest) in memory where possible.
[ -z "${TMPDIR:-}" ] && [ -d /dev/shm ] && [ -w /dev/shm ] && export TMPDIR=/dev/shm
work=$(mktemp -d "${TMPDIR:-/tmp}/hearth-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT

# run_one fuzz_NAME: runs it and writes its report into $work/NAME.result.
run_one() {
    local t=$1 name=${1#fuzz_} out
    mkdir -p "$work/$name" "$work/$name-artifacts"
    cp -r "$here/corpus/$name/." "$work/$name/" 2>/dev/null || true
    # UBSan: abort at the first report, so libFuzzer records the input as a crash.
    if UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ASAN_OPTIONS=detect_leaks=1 \
        "$dir/bin/$t" -seed="${FUZZ_SEED:-1}" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 -artifact_prefix="$work/$name-artifacts/" \
        "$work/$name" >"$work/$name.log" 2>&1; then
        local runs cov
        runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$work/$name.log" | grep -o '[0-9]*$')
        cov=$(grep -oE 'DONE +cov: [0-9]+ ft: [0-9]+' "$work/$name.log" | tail -1 | sed 's/DONE *//')
        echo "ok   $t: ${runs:-?} runs in ${secs} s ($cov)" >"$work/$name.result"
    else
        out="$work/$name.result"
        echo "FAIL $t: see the report below" >"$out"
        grep -E 'ERROR|SUMMARY|runtime error|Test unit written' "$work/$name.log" | head -20 >>"$out"
        local a
        for a in "$work/$name-artifacts"/*; do
            [ -e "$a" ] && echo "     input (base64): $(head -c 4096 "$a" | base64 -w0)" >>"$out"
        done
    fi
}

for t in "$@"; do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n; done
    run_one "$t" &
done
wait
failed=0
for t in "$@"; do
    cat "$work/${t#fuzz_}.result" 2>/dev/null || echo "FAIL $t: no report"
    grep -q '^ok ' "$work/${t#fuzz_}.result" 2>/dev/null || failed=1
done
exit $failed
