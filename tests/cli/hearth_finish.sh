#!/usr/bin/env bash
# How the end of a local run is recorded from what its job left in the run directory:
# a trainer that exits 0 without writing result.json failed (and status and show say so);
# a trainer that outlived its job script, killed with SIGKILL together with the runner, is
# recorded from its result.json by `hearth resume`, whether it finished before the resume
# or while the resume waited for it; a stray background child of the trainer does not
# hold a finished run open, nor turn it into a timeout.
set -u
cd "$(dirname "$0")/../.."
. tests/cli/lib.sh
. tests/cli/hearth_common.bash
hearth_tmp finish
make_trainer

tap_plan 6

run_is() {   # run_is RUN STATE|EXIT_CODE
    local got; got=$(sql "select state || '|' || ifnull(exit_code, '-') from runs where run_id = '$1'")
    [ "$got" = "$2" ] || { echo "$1: $got, want $2"; sql "select run_id, state, exit_code from runs"; return 1; }
}

# ---- exit 0, nothing written ----
printf 'name: empty\ntrainer: ./trainer.sh\n%s\n' "$TINY_BASE" >e.yaml
echo 0 >fail
run_h e submit e.yaml
rm -f fail
run_h est status empty
run_h esh show empty-1
empty_ok() {
    rc_is e 1 && run_is empty-1 'failed|0' || return 1
    grep -q 'empty-1 failed: exit 0 but no result.json' e.err || { cat e.err; return 1; }
}
tap_check "exit 0 without result.json or metrics: failed 'exit 0 but no result.json', submit exits 1" empty_ok
shown_ok() {
    rc_is est 0 && rc_is esh 0 || return 1
    grep -Eq '^empty-1 +failed +1 +0 ' est.out || { cat est.out; return 1; }
    grep -Eq 'running -> failed .*exit 0\): exit 0 but no result.json' esh.out || { cat esh.out; return 1; }
}
tap_check "status lists it failed (exit code 0); show gives the reason" shown_ok

# ---- the runner and the job script killed, the trainer goes on ----
# orphan EXP: submits one run of EXP whose trainer is held back, then kills hearth and the
# job script (SIGKILL, the script alone: its trainer lives on, without a parent to write
# exit_code).
orphan() {
    printf 'name: %s\ntrainer: ./trainer.sh\n%s\n' "$1" "$TINY_BASE" >"$1.yaml"
    : >hold
    "$HEARTH_ABS" --db "$T/h.db" submit "$1.yaml" >"$1.sub.out" 2>"$1.sub.err" &
    local pid=$! d=runs/$1/$1-1
    wait_for 30 test -e "$d/.held"
    wait_for 30 bash -c "[ \"\$(sqlite3 -cmd '.timeout 10000' '$T/h.db' \"select state from runs where run_id = '$1-1'\")\" = running ]"
    kill -9 "$pid"
    wait "$pid" 2>/dev/null
    kill -9 "$(cut -d' ' -f1 "$d/job.lock")"
}
# recorded_ok NAME EXP: resume NAME recorded EXP's run from result.json: completed, exit 0,
# its results in the database, no new run, and no exit_code file (none was written).
recorded_ok() {
    rc_is "$1" 0 && run_is "$2-1" 'completed|0' || { cat "$1.err"; return 1; }
    [ ! -e "runs/$2/$2-1/exit_code" ] || { echo "the job script wrote exit_code"; return 1; }
    [ "$(sql "select count(*) from runs r join experiments e on e.id = r.experiment_id where e.name = '$2'")" = 1 ] ||
        { echo "a new run was made"; return 1; }
    [ "$(sql "select count(*) from results r join runs u on u.id = r.run where u.run_id = '$2-1' and r.tokens_per_s > 0")" = 1 ] ||
        { echo "no result recorded"; return 1; }
    grep -q "$2-1: its job script is gone, but its trainer finished" "$1.err" &&
        ! grep -q 'vanished' "$1.err" || { cat "$1.err"; return 1; }
}

orphan early
rm -f hold
wait_for 60 flock -n runs/early/early-1/job.lock true   # the trainer ended
run_h ra resume early
tap_check "runner and job script killed, the trainer finished before resume: recorded from result.json" recorded_ok ra early

orphan late
"$HEARTH_ABS" --db "$T/h.db" resume late >rb.out 2>rb.err &
pid=$!
wait_for 30 grep -q 'still running; waiting for it' rb.err
rm -f hold
wait "$pid"
echo $? >rb.rc
tap_check "runner and job script killed, the trainer finished while resume waited: recorded from result.json" recorded_ok rb late

# ---- a stray child of the trainer ----
cat >"$T/strayer.sh" <<EOF
#!/bin/bash
sleep 300 >/dev/null 2>&1 &
echo \$! >"\$HEARTH_RUN_DIR/stray.pid"
exec "$TRAIN_ABS" "\$@"
EOF
chmod +x strayer.sh
# The stray outlives the wall-time limit: the run must end with its exit code well before.
printf 'name: stray\ntrainer: ./strayer.sh\n%s\nresources: {time: "0:30"}\n' "$TINY_BASE" >s.yaml
run_h s submit s.yaml
stray_ok() {
    rc_is s 0 && run_is stray-1 'completed|0' || { cat s.err; return 1; }
    [ "$(cat runs/stray/stray-1/exit_code)" = 0 ]
}
tap_check "a trainer leaves a background child: the run completes with its exit code, not a timeout" stray_ok
# running PID: the process exists and is no zombie (an orphan's exit is reaped by init,
# in its own time).
running() { local s; s=$(ps -o stat= -p "$1" 2>/dev/null); [ -n "$s" ] && [ "${s#Z}" = "$s" ]; }
gone_ok() {
    local p; p=$(cat runs/stray/stray-1/stray.pid)
    [ -n "$p" ] && ! running "$p" || { echo "stray $p still running"; return 1; }
    flock -n runs/stray/stray-1/job.lock true || { echo "job.lock still held"; return 1; }
}
tap_check "the stray child is ended with the run's process group" gone_ok
