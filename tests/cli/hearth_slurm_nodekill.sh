#!/usr/bin/env bash
# A node dies under the slurm backend: the slurmd running a job is killed with SIGKILL.
# slurmctld notices after SlurmdTimeout (make test starts the accounting instance of
# contrib/slurm-local, $HEARTH_SLURM_DBD_DIR, with HEARTH_SLURM_SLURMD_TIMEOUT=6), sets the
# node DOWN and the job NODE_FAIL; hearth (whose sacct asks about the job: it left no exit
# code) records the run `requeued`, submits it again kept off the dead node, and the second
# attempt completes: one run row, one result.  The slurmd is started again afterwards
# (start.sh restarts what died), which also ends the orphaned first attempt.
set -u
cd "$(dirname "$0")/../.."
. tests/cli/hearth_slurm_common.bash
slurm_test slurm-nodekill slkill dbd

tap_plan 5

cat >k.yaml <<EOF
name: slkill
trainer: ./trainer.sh
$TINY_BASE
retries: 1
EOF
: >hold
run_h sub submit k.yaml --backend slurm --detach
wait_for 30 test -e runs/slkill/slkill-1/.held
dead=$(cat runs/slkill/slkill-1/nodes 2>/dev/null)
killed_at=$(date +%s)
slurm_node_kill "$dead"
# slurmctld needs SlurmdTimeout and a few pings to call the node dead: then the run goes
# running -> requeued -> submitted again (attempt 2).
wait_for 90 bash -c "[ \"\$(sqlite3 -cmd '.timeout 10000' '$T/h.db' \"select attempts from runs where run_id = 'slkill-1'\")\" = 2 ]"
noticed=$(( $(date +%s) - killed_at ))
node_state=$(sinfo -h -n "$dead" -o '%t' 2>&1)
# The orphaned first attempt still holds; restarting the node's slurmd ends it (slurmctld
# no longer knows its job).  Only then release the hold, so that it never runs the trainer
# beside the second attempt.
slurm_node_restart
wait_for 30 grep -q 'ended with status' runs/slkill/slkill-1/attempt-1/stdout.log
rm -f hold
run_h w wait slkill --timeout 90
job2=$(sql "select backend_job_id from runs where run_id = 'slkill-1'")
exc=$(scontrol --oneliner show job "$job2" 2>&1)

diag() {
    echo "# node $dead: $node_state after ${noticed}s"; cat restart.log
    sql "select r.run_id, e.to_state, e.exit_code, e.note from run_events e join runs r on r.id = e.run order by e.id"
    cat runs/slkill/runner.log; grep -v '^squeue' calls.log; tail -n 5 runs/slkill/slkill-1/*.log runs/slkill/slkill-1/attempt-1/*.log
}
requeue_ok() {
    rc_is w 0 || { diag; return 1; }
    [ "$(sql "select state, attempts from runs where run_id = 'slkill-1'")" = "completed|2" ] || { diag; return 1; }
    [ "$(sql "select group_concat(to_state, ',') from (select e.to_state from run_events e join runs r on r.id = e.run where r.run_id = 'slkill-1' order by e.id)")" = "submitted,running,requeued,submitted,running,completed" ] ||
        { diag; return 1; }
    sql "select note from run_events where to_state = 'requeued'" | grep -q 'node failure' || { diag; return 1; }
}
tap_check "slurmd killed under a running job: node DOWN, NODE_FAIL -> requeued -> submitted again -> completed (noticed after ${noticed}s)" requeue_ok

nodup_ok() {
    [ "$(calls sbatch)" = 2 ] && [ "$(sql "select count(*) from runs")" = 1 ] &&
        [ "$(sql "select count(*) from results")" = 1 ] || { sql "select * from results"; grep '^sbatch' calls.log; return 1; }
    # The trainer ran to its end once (the second attempt); the first never got past the hold.
    [ "$(grep -c 'slkill-1' invocations.log)" -le 2 ] && grep -q 'ended with status 0' runs/slkill/slkill-1/stdout.log ||
        { cat invocations.log; tail -n 3 runs/slkill/slkill-1/stdout.log; return 1; }
}
tap_check "two sbatch calls, one run row, one result" nodup_ok

acct_ok() {
    # The first job left no exit code: one sacct asked about it, and said NODE_FAIL.
    local job1
    job1=$(grep -m1 '^sacct ' calls.log | grep -oE -- '--jobs [^ ]+' | cut -d' ' -f2)
    [ -n "$job1" ] && [ "$(real sacct -n -P -X -j "$job1" -o State)" = NODE_FAIL ] ||
        { grep '^sacct' calls.log; return 1; }
    grep -E '^(squeue|sacct) ' calls.log | awk '$1 == "sacct" && prev == "sacct" {bad = 1} {prev = $1} END {exit bad}'
}
tap_check "the dead node's job learnt from sacct (NODE_FAIL), at most one sacct per poll cycle" acct_ok

exclude_ok() {
    [ -n "$dead" ] && [ -n "$job2" ] || { echo "# node '$dead', job '$job2'"; return 1; }
    echo "$exc" | grep -q " ExcNodeList=$dead " || { echo "# $exc"; return 1; }
    grep '^sbatch ' "$T/calls.log" | tail -n 1 | grep -q -- "--exclude=$dead" || { grep '^sbatch ' "$T/calls.log"; return 1; }
}
tap_check "the resubmitted job excludes the dead node (ExcNodeList=${dead:-?})" exclude_ok

back_ok() {
    wait_for 30 bash -c "[ -z \"\$(sinfo -h -N -o '%t' | grep -v idle)\" ]" || { sinfo -N; cat restart.log; return 1; }
    kill -0 "$(cat "$SLURM_DIR/run/slurmd-$dead.pid")" 2>/dev/null
}
tap_check "the killed slurmd runs again, every node idle for the tests that follow" back_ok
