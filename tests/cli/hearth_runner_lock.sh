#!/usr/bin/env bash
# One runner per experiment, and who it is: a second runner (`hearth resume`, `hearth
# submit`) started while a detached runner works on the experiment waits, naming the real
# holder ("another runner (pid N on HOST)"), and `hearth status` names it too; once the
# first ends, the second takes over and finishes.  A lock held by a process that recorded
# nothing (as `hearth wait` and `hearth status` hold it for an instant, or a runner that has
# not yet written its record) is never reported as "pid 0" or as the pid of a runner that
# is gone.
set -u
cd "$(dirname "$0")/../.."
. tests/cli/lib.sh
. tests/cli/hearth_common.bash
hearth_tmp runlock
make_trainer

tap_plan 5

HOST=$(hostname)
cat >l.yaml <<EOF
name: lockx
trainer: ./trainer.sh
$TINY_BASE
matrix:
  train.seed: [1, 2]
EOF
: >hold
run_h first submit l.yaml --detach --jobs 1
first=$(sed -n 's/.*runner started (pid \([0-9]*\)).*/\1/p' first.out)
wait_for 60 test -e runs/lockx/lockx-1/.held
# The second runner, for real: it must wait for the first and say who that is.
"$HEARTH_ABS" --db "$T/h.db" resume lockx >second.out 2>second.err &
second=$!
wait_for 30 grep -q 'another runner' second.err
run_h st status
named_ok() {
    [ -n "$first" ] || { cat first.out first.err; return 1; }
    grep -q "another runner (pid $first on $HOST) is working on this experiment" second.err ||
        { echo "first runner: pid $first on $HOST"; cat second.err; return 1; }
    ! grep -q 'pid 0' second.err || return 1
}
tap_check "a second runner (resume) waits, naming the first runner's pid and host" named_ok
tap_check "status names the runner's pid and host" grep -Eq "^lockx .*pid $first on $HOST" st.out
rm -f hold
wait "$second"
echo $? >second.rc
takeover_ok() {
    rc_is second 0 || return 1
    [ "$(sql "select count(*) from runs where state = 'completed'")" = 2 ] ||
        { sql "select run_id, state from runs"; return 1; }
    grep -q 'hearth: runner .* started' runs/lockx/runner.log &&
        grep -q '^lockx: 2 completed' runs/lockx/runner.log || { cat runs/lockx/runner.log; return 1; }
}
tap_check "the second runner takes over once the first ends; the sweep completes" takeover_ok

# A lock held by something that never records itself, over the record of a runner that is
# gone (the last runner's) and over an empty record.
held_resume() {   # held_resume NAME: resume while runner.lock is held by a process that
                  # records nothing, until NAME.err says who holds it
    local f=runs/lockx/runner.lock
    rm -f release
    flock -s "$f" bash -c 'while [ ! -e release ]; do sleep 0.1; done' &
    local holder=$!
    wait_for 10 bash -c "! flock -n '$f' true" || return 1
    "$HEARTH_ABS" --db "$T/h.db" resume lockx >"$1.out" 2>"$1.err" &
    local r=$!
    wait_for 60 grep -q 'another' "$1.err"
    : >release
    wait "$holder"
    wait "$r"
    echo $? >"$1.rc"
}
unknown_ok() {
    local f=runs/lockx/runner.lock
    grep -q "^$second $HOST\$" "$f" || { echo "record: $(cat "$f"), want $second $HOST"; return 1; }
    held_resume stale
    rc_is stale 0 || return 1
    ! grep -q "pid $second\|pid 0" stale.err || { cat stale.err; return 1; }
    grep -q 'another process holds .*runner.lock (it recorded no pid)' stale.err || { cat stale.err; return 1; }
    : >"$f"
    held_resume empty
    rc_is empty 0 || return 1
    ! grep -q 'pid 0' empty.err || { cat empty.err; return 1; }
    grep -q 'another process holds .*runner.lock' empty.err || { cat empty.err; return 1; }
}
tap_check "a lock held by a process that recorded nothing (stale or empty record): no 'pid 0', no dead runner's pid" unknown_ok
tap_check "database integrity" bash -c "[ \"\$(sqlite3 $T/h.db 'pragma integrity_check')\" = ok ]"
