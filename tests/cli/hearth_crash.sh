#!/usr/bin/env bash
# Crash safety of the local runner: `hearth submit` killed with SIGKILL mid-sweep and run
# again finishes the sweep without running any completed point twice (live jobs are waited
# for, finished ones ingested); a job that vanished gets a new run; `hearth wait` notices a
# sweep nobody runs; --detach, wait and cancel.
set -u
cd "$(dirname "$0")/../.."
. tests/cli/lib.sh
. tests/cli/hearth_common.bash
hearth_tmp crash
make_trainer

tap_plan 12

state_count() { sql "select count(*) from runs r join experiments e on e.id = r.experiment_id where e.name = '$1' and r.state = '$2'"; }
ge() { [ "$(state_count "$1" "$2")" -ge "$3" ]; }

# ---- SIGKILL mid-sweep, then submit again ----
cat >c.yaml <<EOF
name: crash
trainer: ./trainer.sh
$TINY_BASE
matrix:
  train.seed: [1, 2, 3, 4, 5, 6]
EOF
echo 0.3 >slow
"$HEARTH_ABS" --db "$T/h.db" submit c.yaml --jobs 2 >kill1.out 2>kill1.err &
pid=$!
# Once a run has completed, hold the jobs back; kill the runner while two of them run.
wait_for 30 bash -c "[ \"\$(sqlite3 -cmd '.timeout 10000' '$T/h.db' \"select count(*) from runs where state = 'completed'\")\" -ge 1 ]"
: >hold
wait_for 30 bash -c "[ \$(ls runs/crash/*/.held 2>/dev/null | wc -l) -ge 2 ]"
kill -9 "$pid"
wait "$pid" 2>/dev/null
before=$(state_count crash completed)
killed_ok() { [ "$before" -ge 1 ] && [ "$before" -lt 6 ] && [ "$(state_count crash running)" -ge 1 ]; }
tap_check "submit killed mid-sweep: some runs completed, some running, some pending" killed_ok

# The jobs outlive the killed runner; with no runner, wait must not hang.
run_h orphan wait crash
tap_check "wait with runs in flight but no runner: exit 1, says so" bash -c "[ \"\$(cat '$T/orphan.rc')\" = 1 ] && grep -q 'no runner' '$T/orphan.err'"

# Submit again while the old jobs still run; let them go once it has found them.
"$HEARTH_ABS" --db "$T/h.db" submit c.yaml --jobs 2 >again.out 2>again.err &
pid=$!
wait_for 30 grep -q 'still running; waiting for it' again.err
rm -f hold
wait "$pid"
echo $? >again.rc
again_ok() {
    rc_is again 0 || return 1
    [ "$(state_count crash completed)" = 6 ] || { sql "select run_id, state from runs"; return 1; }
    [ "$(sql "select count(*) from runs")" = 6 ] || { echo "extra runs were created"; return 1; }
}
tap_check "submit again: the sweep finishes, 6 runs completed, no extra runs" again_ok

once_ok() {
    [ "$(wc -l <invocations.log)" = 6 ] || { echo "trainer ran $(wc -l <invocations.log) times:"; cat invocations.log; return 1; }
    [ -z "$(cut -d' ' -f1 invocations.log | sort | uniq -d)" ] || { echo "a point ran twice"; return 1; }
    [ "$(sql "select max(attempts) from runs")" = 1 ]
}
tap_check "no point ran twice (trainer invocations, attempts)" once_ok
tap_check "live jobs of the killed runner were waited for, not rerun" grep -q 'still running; waiting for it' "$T/again.err"
rm -f slow

# ---- a job that vanished: failed, and its point gets a new run ----
cat >v.yaml <<EOF
name: vanish
trainer: ./trainer.sh
$TINY_BASE
matrix:
  train.seed: [11, 12]
EOF
: >hold
"$HEARTH_ABS" --db "$T/h.db" submit v.yaml --jobs 2 >kill2.out 2>kill2.err &
pid=$!
wait_for 30 bash -c "[ \"\$(sqlite3 -cmd '.timeout 10000' '$T/h.db' \"select count(*) from runs r join experiments e on e.id = r.experiment_id where e.name = 'vanish' and r.state = 'running'\")\" = 2 ]"
kill -9 "$pid"
wait "$pid" 2>/dev/null
jpid=$(cut -d' ' -f1 runs/vanish/vanish-1/job.lock)
kill -9 -- "-$jpid"
wait_for 10 flock -n runs/vanish/vanish-1/job.lock true
rm -f hold
run_h resume resume vanish
vanish_ok() {
    rc_is resume 0 || return 1
    [ "$(sql "select state from runs where run_id = 'vanish-1'")" = failed ] || return 1
    [ "$(sql "select count(*) from run_events e join runs r on r.id = e.run where r.run_id = 'vanish-1' and e.note = 'job process vanished'")" = 1 ] || { echo "no 'vanished' note"; return 1; }
    [ "$(sql "select state from runs where run_id = 'vanish-2'")" = completed ] || return 1
    [ "$(sql "select state from runs where run_id = 'vanish-3'")" = completed ] || { echo "no replacement run"; sql "select run_id, state from runs"; return 1; }
    [ "$(sql "select count(distinct config_hash) from runs where run_id in ('vanish-1', 'vanish-3')")" = 1 ] || { echo "replacement has another config"; return 1; }
}
tap_check "vanished job: run failed ('job process vanished'), its point got a new run that completed" vanish_ok
tap_check "vanish: each point completed exactly once" bash -c "[ \"\$(sqlite3 -cmd '.timeout 10000' '$T/h.db' \"select count(*) from runs r join experiments e on e.id = r.experiment_id where e.name = 'vanish' and r.state = 'completed' group by r.config_hash\" | sort -u)\" = 1 ]"

# ---- --detach, wait ----
cat >d.yaml <<EOF
name: detached
trainer: ./trainer.sh
$TINY_BASE
matrix:
  train.seed: [21, 22, 23]
EOF
run_h det submit d.yaml --detach --jobs 2
run_h detwait wait detached
detach_ok() {
    rc_is det 0 && grep -q 'runner started (pid' det.out || { cat det.out det.err; return 1; }
    rc_is detwait 0 || return 1
    [ "$(state_count detached completed)" = 3 ] || return 1
    [ -s runs/detached/runner.log ] && grep -q '3 completed' runs/detached/runner.log
}
tap_check "submit --detach returns at once; wait blocks until the sweep is done (exit 0)" detach_ok

# ---- cancel an experiment while its detached runner is running ----
cat >k.yaml <<EOF
name: cancelme
trainer: ./trainer.sh
$TINY_BASE
matrix:
  train.seed: [31, 32, 33, 34]
EOF
echo 30 >slow
run_h det2 submit k.yaml --detach --jobs 2
wait_for 20 bash -c "[ \"\$(sqlite3 -cmd '.timeout 10000' '$T/h.db' \"select count(*) from runs r join experiments e on e.id = r.experiment_id where e.name = 'cancelme' and r.state = 'running'\")\" = 2 ]"
run_h st status
tap_check "status shows the live runner's pid" grep -Eq '^cancelme .*pid [0-9]+' "$T/st.out"
start=$(date +%s)
run_h cancel cancel cancelme
run_h cwait wait cancelme
cancel_ok() {
    rc_is cancel 0 || return 1
    [ "$(state_count cancelme cancelled)" = 4 ] || { sql "select run_id, state from runs"; return 1; }
    [ $(( $(date +%s) - start )) -lt 28 ] || { echo "cancel took too long (the jobs sleep 30 s)"; return 1; }
    local f
    for f in runs/cancelme/*/job.lock; do
        flock -n "$f" true || { echo "$f still held: a job survived"; return 1; }
    done
}
tap_check "cancel EXP: every run cancelled, the running jobs killed" cancel_ok
tap_check "wait after cancel: exit 1 (points without a completed run)" rc_is cwait 1
tap_check "the detached runner ends after the cancel" wait_for 10 flock -n runs/cancelme/runner.lock true
rm -f slow
