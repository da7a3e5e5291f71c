#!/usr/bin/env bash
# A node failure under the slurm backend, on the test cluster (contrib/slurm-local, started
# by make test): the node running a job is set DOWN (`scontrol update state=down`, which
# kills its jobs as NODE_FAIL; ReturnToService=2 brings it back at once), hearth records the run `requeued`, submits it again within
# `retries`, and the second attempt completes: one run row, one result.  The second attempt
# is kept off the failed node (sbatch --exclude, ExcNodeList in scontrol show job).
set -u
cd "$(dirname "$0")/../.."
. tests/cli/hearth_slurm_common.bash
slurm_test slurm-nodefail slnode

tap_plan 4

cat >n.yaml <<EOF
name: slnode
trainer: ./trainer.sh
$TINY_BASE
retries: 1
EOF
: >hold
run_h sub submit n.yaml --backend slurm --detach
wait_for 30 test -e runs/slnode/slnode-1/.held
failed_node=$(cat runs/slnode/slnode-1/nodes 2>/dev/null)
slurm_node_down "$failed_node"
# The run goes running -> requeued -> submitted again (attempt 2); then let it finish.
wait_for 60 bash -c "[ \"\$(sqlite3 -cmd '.timeout 10000' '$T/h.db' \"select attempts from runs where run_id = 'slnode-1'\")\" = 2 ]"
# Slurm kills the first attempt's processes asynchronously: release the hold only once they
# ended (their log, moved to attempt-1/ by the retry, says so), so that the first attempt
# never gets to run the trainer beside the second.
wait_for 30 grep -q 'ended with status' runs/slnode/slnode-1/attempt-1/stdout.log
rm -f hold
run_h w wait slnode --timeout 90
# Read the second attempt's job while slurmctld still remembers it (MinJobAge).
job2=$(sql "select backend_job_id from runs where run_id = 'slnode-1'")
exc=$(scontrol --oneliner show job "$job2" 2>&1)
slurm_node_resume

diag() {
    sql "select r.run_id, e.to_state, e.exit_code, e.note from run_events e join runs r on r.id = e.run order by e.id"
    cat runs/slnode/runner.log; grep '^s[qbc]' calls.log | grep -v '^squeue' ; tail -n 5 runs/slnode/slnode-1/*.log runs/slnode/slnode-1/attempt-1/*.log
}
requeue_ok() {
    rc_is w 0 || { diag; return 1; }
    [ "$(sql "select state, attempts from runs where run_id = 'slnode-1'")" = "completed|2" ] ||
        { sql "select run_id, state, attempts, exit_code from runs"; cat runs/slnode/runner.log; return 1; }
    [ "$(sql "select group_concat(to_state, ',') from (select e.to_state from run_events e join runs r on r.id = e.run where r.run_id = 'slnode-1' order by e.id)")" = "submitted,running,requeued,submitted,running,completed" ] ||
        { sql "select to_state, note from run_events"; return 1; }
    sql "select note from run_events where to_state = 'requeued'" | grep -q 'node failure'
}
tap_check "node set DOWN under a running job: NODE_FAIL -> requeued -> submitted again -> completed" requeue_ok

nodup_ok() {
    [ "$(calls sbatch)" = 2 ] && [ "$(sql "select count(*) from runs")" = 1 ] &&
        [ "$(sql "select count(*) from results")" = 1 ] || { sql "select * from results"; return 1; }
    # The first attempt's logs are kept aside (it was killed: TERM, 143); the second's are
    # the run's.
    grep -q 'ended with status 143' runs/slnode/slnode-1/attempt-1/stdout.log &&
        grep -q 'ended with status 0' runs/slnode/slnode-1/stdout.log
}
tap_check "two sbatch calls, one run row, one result; attempt 1 kept aside" nodup_ok

exclude_ok() {
    [ -n "$failed_node" ] && [ -n "$job2" ] || { echo "# node '$failed_node', job '$job2'"; return 1; }
    echo "$exc" | grep -q " ExcNodeList=$failed_node " || { echo "# $exc"; return 1; }
    # Only the resubmission excludes it: the first sbatch had no --exclude.
    [ "$(grep '^sbatch ' "$T/calls.log" | grep -c -- "--exclude=$failed_node")" = 1 ] &&
        grep '^sbatch ' "$T/calls.log" | tail -n 1 | grep -q -- "--exclude=$failed_node" ||
        { grep '^sbatch ' "$T/calls.log"; return 1; }
    # An attempt that ended well leaves no exclusion behind.
    [ ! -e runs/slnode/slnode-1/exclude_nodes ]
}
tap_check "the resubmitted job excludes the failed node (ExcNodeList=$failed_node)" exclude_ok

back_ok() {
    wait_for 30 bash -c "[ -z \"\$(sinfo -h -N -o '%t' | grep -v idle)\" ]" || { sinfo -N; return 1; }
}
tap_check "the node is back (idle) for the tests that follow" back_ok
