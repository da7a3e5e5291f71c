#!/usr/bin/env bash
# Runs test executables that speak TAP (cmocka binaries with CMOCKA_MESSAGE_OUTPUT=TAP,
# shell scripts using tests/cli/lib.sh) and prints one summary line:
#   N passed, N failed, N skipped
# A program that crashes or reports fewer results than it planned counts the
# missing ones as failed, and a test program that does not exist counts as one failure,
# so a dying or unbuilt test can never look green.
set -u
export CMOCKA_MESSAGE_OUTPUT=TAP
# Idle OpenMP workers sleep instead of spinning: tests share 2 cores with each other's
# child processes, where spinning threads starve the ones doing the work.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
export BUILD=${BUILD:-build}
pass=0 fail=0 skip=0
failed_names=()
logdir=$(mktemp -d "${TMPDIR:-/tmp}/hearth-tests.XXXXXX")
for t in "$@"; do
    name=$(basename "$t")
    if [ ! -e "$t" ]; then   # a test that was not built is a failure, never a silent pass
        echo "---- $name: missing ($t) ----"
        printf '%-40s %4d passed %3d failed %3d skipped %5ss  %s\n' "$name" 0 1 0 0 MISSING
        fail=$((fail + 1))
        failed_names+=("$name")
        continue
    fi
    log="$logdir/$name.log"
    start=$(date +%s)
    "$t" >"$log" 2>&1
    rc=$?
    secs=$(( $(date +%s) - start ))
    planned=$(grep -m1 -E '^1\.\.[0-9]+' "$log" | sed 's/^1\.\.//')
    p=$(grep -cE '^ok ' "$log")
    s=$(grep -cE '^not ok .*# SKIP' "$log")
    f=$(grep -E '^not ok ' "$log" | grep -cv '# SKIP')
    seen=$((p + s + f))
    if [ -n "$planned" ] && [ "$seen" -lt "$planned" ]; then
        f=$((f + planned - seen))
    fi
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        f=1   # crashed or failed outside any test case
    fi
    pass=$((pass + p)); skip=$((skip + s)); fail=$((fail + f))
    status=ok
    if [ "$f" -gt 0 ]; then
        status=FAIL
        failed_names+=("$name")
        echo "---- $name (exit $rc) ----"
        grep -vE '^ok ' "$log" | tail -n 60
    fi
    printf '%-40s %4d passed %3d failed %3d skipped %5ss  %s\n' "$name" "$p" "$f" "$s" "$secs" "$status"
done
if [ "${#failed_names[@]}" -gt 0 ]; then
    echo "failed: ${failed_names[*]} (logs in $logdir)"
else
    rm -rf "$logdir"
fi
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
