#!/usr/bin/env bash
# The results database deleted while a sweep runs (`rm hearth.db*` during `hearth submit`):
# the runner stops with exit 1 and a message naming the file and the way back; `hearth
# ingest` rebuilds the database from the run directories (finished runs with their results,
# live ones left running), `hearth resume` finishes the sweep without running any point
# twice, and ingesting again records nothing twice.
set -u
cd "$(dirname "$0")/../.."
. tests/cli/lib.sh
. tests/cli/hearth_common.bash
hearth_tmp dblost
make_trainer

tap_plan 9

state_count() { sql "select count(*) from runs r join experiments e on e.id = r.experiment_id where e.name = '$1' and r.state = '$2'"; }

cat >l.yaml <<EOF
name: lost
trainer: ./trainer.sh
$TINY_BASE
matrix:
  train.seed: [1, 2, 3, 4, 5, 6, 7, 8]
EOF
echo 0.3 >slow
"$HEARTH_ABS" --db "$T/h.db" submit l.yaml --jobs 2 >sub.out 2>sub.err &
pid=$!
# Once a run has completed, hold the jobs back; delete the database while two of them run.
wait_for 60 bash -c "[ \"\$(sqlite3 -cmd '.timeout 10000' '$T/h.db' \"select count(*) from runs where state = 'completed'\")\" -ge 1 ]"
: >hold
wait_for 60 bash -c "[ \$(ls runs/lost/*/.held 2>/dev/null | wc -l) -ge 2 ]"
rm -f "$T"/h.db "$T"/h.db-wal "$T"/h.db-shm
# The runner must stop by itself; a runner that does not notice would wait for the held
# jobs forever, so they are let go after a while and it would then end "successfully".
if ! wait_for 60 bash -c "! kill -0 $pid"; then
    rm -f hold
fi
wait "$pid"
echo $? >sub.rc
rm -f hold
stop_ok() {
    [ "$(cat sub.rc)" = 1 ] || { echo "submit exit status $(cat sub.rc), want 1"; cat sub.err; return 1; }
    grep -q "$T/h.db: the results database was deleted while hearth was using it" sub.err || { cat sub.err; return 1; }
    grep -q "ingest $T/runs/lost" sub.err || { echo "no recovery command"; cat sub.err; return 1; }
}
tap_check "database deleted mid-sweep: submit exits 1 naming the file and the way back" stop_ok
tap_check "no 'completed' summary after the database was lost" bash -c "! grep -q 'completed' '$T/sub.out'"

# The held jobs outlive the runner and finish into their run directories.
for f in runs/lost/*/job.lock; do wait_for 60 flock -n "$f" true; done
run_h ing1 ingest runs/lost
ingest_ok() {
    rc_is ing1 0 || return 1
    [ "$(sql "select count(*) from runs")" = 8 ] || { sql "select run_id, state from runs"; return 1; }
    # Every run that had run is completed, with its result and its 3 steps of metrics.
    local ran; ran=$(ls -d runs/lost/*/result.json | wc -l)
    [ "$ran" -ge 3 ] || { echo "only $ran runs had run"; return 1; }
    [ "$(state_count lost completed)" = "$ran" ] || { sql "select run_id, state from runs"; return 1; }
    [ "$(sql "select count(*) from results")" = "$ran" ] || return 1
    [ "$(sql "select count(*) from metrics")" = $((3 * ran)) ] || return 1
    [ "$(state_count lost pending)" = $((8 - ran)) ] || { sql "select run_id, state from runs"; return 1; }
}
tap_check "ingest: every run is back, finished ones completed with results and metrics, the rest pending" ingest_ok
tap_check "ingest: the config of each run is back (query by config key)" bash -c "[ \"\$('$HEARTH_ABS' --db '$T/h.db' query 'train.seed >= 1' --columns run_id --format csv | tail -n +2 | wc -l)\" = 8 ]"
left_ok() {   # the runs that had not started when the database went
    [ "$(state_count lost pending)" = 0 ] || grep -q 'hearth resume lost' ing1.out || { cat ing1.out; return 1; }
    grep -q '^lost: .* completed' ing1.out
}
tap_check "ingest: says what each experiment holds, and how to finish what is left" left_ok

run_h res resume lost
resume_ok() {
    rc_is res 0 || return 1
    [ "$(state_count lost completed)" = 8 ] || { sql "select run_id, state from runs"; return 1; }
    [ "$(sql "select count(*) from runs")" = 8 ] || { echo "extra runs were created"; return 1; }
}
tap_check "resume after ingest: the sweep finishes, 8 runs completed, no extra runs" resume_ok
once_ok() {
    [ "$(wc -l <invocations.log)" = 8 ] || { echo "trainer ran $(wc -l <invocations.log) times:"; cat invocations.log; return 1; }
    [ -z "$(cut -d' ' -f1 invocations.log | sort | uniq -d)" ] || { echo "a point ran twice"; return 1; }
}
tap_check "no point ran twice" once_ok

run_h ing2 ingest
again_ok() {
    rc_is ing2 0 || return 1
    grep -q '0 recorded, 8 already in' ing2.err || { cat ing2.err; return 1; }
    [ "$(sql "select count(*) from runs")" = 8 ] && [ "$(state_count lost completed)" = 8 ] &&
        [ "$(sql "select count(*) from results")" = 8 ]
}
tap_check "ingest again (default: the runs directory): nothing recorded twice, says so" again_ok

# A live runner owns its experiment: ingest leaves it alone.
cat >b.yaml <<EOF
name: busy
trainer: ./trainer.sh
$TINY_BASE
matrix:
  train.seed: [7]
EOF
: >hold
run_h bsub submit b.yaml --detach
wait_for 60 bash -c "[ \$(ls runs/busy/*/.held 2>/dev/null | wc -l) -ge 1 ]"
run_h ing3 ingest runs/busy
rm -f hold
run_h bwait wait busy
busy_ok() {
    rc_is ing3 1 || return 1
    grep -q 'busy: a runner (pid [0-9]* on [^)]*) is working on this experiment' ing3.err || { cat ing3.err; return 1; }
    rc_is bwait 0
}
tap_check "ingest while the experiment's runner works: left alone, exit 1, says why" busy_ok
