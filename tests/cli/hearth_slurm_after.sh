#!/usr/bin/env bash
# `after: {experiment, on}` as native Slurm dependencies, on the test cluster
# (contrib/slurm-local, started by make test): an experiment submitted while the one it
# follows still has jobs in flight is queued at once with --dependency=afterok:ID...
# (pending in Slurm, reason Dependency).  When the first stage fails, Slurm cancels the
# later one (--kill-on-invalid-dep): it ends cancelled, not stuck; when it ends ok, the
# later one runs after it (its StartTime is not before the first's EndTime).
set -u
cd "$(dirname "$0")/../.."
. tests/cli/hearth_slurm_common.bash
slurm_test slurm-after slafter

tap_plan 3

state() { sql "select state from runs where run_id = '$1'"; }
job_of() { sql "select backend_job_id from runs where run_id = '$1'"; }
# spec NAME [AFTER ON]: a one-run experiment, optionally after experiment AFTER.
spec() {
    { echo "name: $1"; echo "trainer: ./trainer.sh"; echo "$TINY_BASE"; echo "retries: 0"
      [ -n "${2:-}" ] && echo "after: {experiment: $2, on: $3}"; } >"$1.yaml"
}
# chain FIRST LATER ON: FIRST held running, LATER submitted after it (on: ON); waits until
# LATER's job is queued behind FIRST's (afterON); sets first_job, later_job, later_pending.
chain() {
    spec "$1"; spec "$2" "$1" "$3"
    : >hold
    run_h "$1" submit "$1.yaml" --backend slurm --detach
    wait_for 30 test -e "runs/$1/$1-1/.held"
    first_job=$(job_of "$1-1")
    run_h "$2" submit "$2.yaml" --backend slurm --detach
    wait_for 30 grep -q -- "--job-name=$2-1 .*--dependency=after$3:$first_job --kill-on-invalid-dep=yes" calls.log
    wait_for 30 bash -c "[ -n \"\$(sqlite3 -cmd '.timeout 10000' '$T/h.db' \"select backend_job_id from runs where run_id = '$2-1'\")\" ]"
    later_job=$(job_of "$2-1")
    later_pending=$(squeue -h -j "$later_job" -o '%T %r' 2>&1)
    rm -f hold
}

# ---- the first stage fails: Slurm cancels the later one ----
echo 7 >fail
chain slafter-f slafter-g ok
run_h gw wait slafter-g --timeout 90
run_h fw wait slafter-f --timeout 60
rm -f fail
queued_ok() {
    [ -n "$first_job" ] && [ -n "$later_job" ] ||
        { echo "jobs '$first_job' '$later_job'"; grep '^sbatch' calls.log; cat runs/slafter-g/runner.log; return 1; }
    [ "$later_pending" = "PENDING Dependency" ] || { echo "later job: $later_pending"; return 1; }
}
tap_check "after a stage in flight: sbatch --dependency=afterok:ID, pending on Dependency" queued_ok
failed_chain_ok() {
    rc_is fw 1 && [ "$(state slafter-f-1)" = failed ] || { sql "select run_id, state from runs"; return 1; }
    rc_is gw 1 || { cat runs/slafter-g/runner.log; return 1; }
    [ "$(state slafter-g-1)" = cancelled ] || { sql "select run_id, state from runs"; return 1; }
    # Slurm itself cancelled it (hearth never called scancel).
    st=$(squeue -h -t all -j "$later_job" -o %T 2>/dev/null)
    [ "${st#CANCELLED}" != "$st" ] || { echo "slurm state '$st'"; return 1; }
    ! grep -q '^scancel' calls.log || { grep '^scancel' calls.log; return 1; }
    ! grep -q "slafter-g-1" invocations.log
}
tap_check "first stage failed: Slurm cancelled the later stage (kill-on-invalid-dep), never run, not stuck" failed_chain_ok

# ---- the first stage ends ok: the later one runs after it ----
chain slafter-h slafter-i ok
run_h hw wait slafter-h --timeout 90
run_h iw wait slafter-i --timeout 90
# Read both jobs while slurmctld still remembers them (MinJobAge).
first_end=$(scontrol --oneliner show job "$first_job" 2>&1 | grep -o ' EndTime=[^ ]*' | cut -d= -f2)
later_start=$(scontrol --oneliner show job "$later_job" 2>&1 | grep -o ' StartTime=[^ ]*' | cut -d= -f2)
ok_chain_ok() {
    rc_is hw 0 && rc_is iw 0 || { sql "select run_id, state from runs"; return 1; }
    [ "$(state slafter-h-1)" = completed ] && [ "$(state slafter-i-1)" = completed ] ||
        { sql "select run_id, state from runs"; return 1; }
    [ "$later_pending" = "PENDING Dependency" ] || { echo "later job: $later_pending"; return 1; }
    grep -q -- "--job-name=slafter-i-1 .*--dependency=afterok:$first_job " calls.log ||
        { grep '^sbatch' calls.log; return 1; }
    # Times like 2026-11-29T10:52:35 compare as strings.
    [ -n "$first_end" ] && [ -n "$later_start" ] && ! [[ "$later_start" < "$first_end" ]] ||
        { echo "first ended $first_end, later started $later_start"; return 1; }
}
tap_check "first stage ok: the later stage ran after it (start >= first's end), both completed" ok_chain_ok
