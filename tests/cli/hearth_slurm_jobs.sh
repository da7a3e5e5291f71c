#!/usr/bin/env bash
# How Slurm jobs end, on the test cluster (contrib/slurm-local, started by make test): a
# failing run is failed with its exit code; `hearth cancel` scancels a running job and the
# run is cancelled; an experiment `after` a failed one is cancelled, not stuck; a hearth
# killed right after sbatch leaves a job that `hearth status` adopts (found by its name or
# array task), and `hearth resume` follows it to its end: nothing is submitted twice.
set -u
cd "$(dirname "$0")/../.."
. tests/cli/hearth_slurm_common.bash
slurm_test slurm-jobs sljobs

tap_plan 9

state() { sql "select state from runs where run_id = '$1'"; }

# ---- a failing run ----
slurm_check_failing_run sljobs-fail slurm ""

# ---- dependency: after a failed experiment ----
cat >a.yaml <<EOF
name: sljobs-after
trainer: ./trainer.sh
$TINY_BASE
after: {experiment: sljobs-fail, on: ok}
EOF
run_h after submit a.yaml --backend slurm
after_ok() {
    rc_is after 1 || return 1
    [ "$(state sljobs-after-1)" = cancelled ] || { sql "select run_id, state from runs"; return 1; }
    ! grep -q 'job-name=sljobs-after' calls.log
}
tap_check "after: {on: ok} a failed experiment: cancelled, never submitted, not stuck" after_ok

# ---- cancel a running job ----
cat >c.yaml <<EOF
name: sljobs-cancel
trainer: ./trainer.sh
$TINY_BASE
retries: 0
EOF
: >hold
run_h cs submit c.yaml --backend slurm --detach
wait_for 30 test -e runs/sljobs-cancel/sljobs-cancel-1/.held
run_h cancel cancel sljobs-cancel-1
run_h cw wait sljobs-cancel --timeout 60
rm -f hold
cancel_ok() {
    rc_is cancel 0 || return 1
    [ "$(state sljobs-cancel-1)" = cancelled ] || { sql "select run_id, state from runs"; return 1; }
    id=$(sql "select backend_job_id from runs where run_id = 'sljobs-cancel-1'")
    grep -q "^scancel $id\$" calls.log || { echo "no scancel $id"; cat calls.log | grep -v squeue; return 1; }
    # Slurm itself says so: the job is gone or CANCELLED.
    st=$(squeue -h -t all -j "$id" -o %T 2>/dev/null)
    [ -z "$st" ] || [ "${st#CANCELLED}" != "$st" ] || { echo "slurm state $st"; return 1; }
    rc_is cw 1
}
tap_check "hearth cancel RUN: scancel, state cancelled, hearth wait ends (exit 1)" cancel_ok

# ---- adoption: hearth killed right after sbatch ----
# adopt EXP N: an experiment of N runs (N > 1: one job array), hearth killed -9 by the
# sbatch wrapper as soon as sbatch answered, then `hearth resume EXP` while the jobs are
# held running.
adopt() {
    local exp=$1 n=$2 seeds
    seeds=$(seq -s, 1 "$n")
    cat >"$exp.yaml" <<EOF
name: $exp
trainer: ./trainer.sh
$TINY_BASE
matrix: {train.seed: [$seeds]}
EOF
    : >hold
    : >kill_after_sbatch
    rm -f sbatch_ids
    run_h "$exp-kill" submit "$exp.yaml" --backend slurm
    tap_check "$exp: hearth killed -9 right after sbatch: $n run(s) left submitted, no job id recorded" killed_ok "$exp" "$n"
    wait_for 30 test -e "runs/$exp/$exp-$n/.held"
    run_h "$exp-st" status "$exp"
    tap_check "$exp: hearth status adopts the held job(s): running, job id(s) recorded" status_adopt_ok "$exp" "$n"
    "$HEARTH_ABS" --db "$T/h.db" resume "$exp" >"$exp-res.out" 2>"$exp-res.err" &
    local res=$!
    wait_for 30 grep -q 'still running' "$exp-res.err"
    rm -f hold
    wait "$res"; echo $? >"$exp-res.rc"
    tap_check "$exp: hearth resume follows the adopted job(s) to the end: completed, sbatch ran once" adopt_ok "$exp" "$n"
}
killed_ok() {
    rc_is "$1-kill" 137 >/dev/null || { echo "exit $(cat "$1-kill.rc")"; return 1; }
    [ "$(sql "select count(*) from runs r join experiments e on e.id = r.experiment_id where e.name = '$1' and r.state = 'submitted' and r.backend_job_id is null")" = "$2" ] ||
        { sql "select run_id, state, backend_job_id from runs"; return 1; }
}
# job_of EXP N I: the Slurm job id run I of EXP must have (sbatch's answer; an array's task).
job_of() {
    local id; id=$(cat sbatch_ids)
    if [ "$2" -gt 1 ]; then echo "${id}_$(($3 - 1))"; else echo "$id"; fi
}
status_adopt_ok() {
    local exp=$1 n=$2 i
    rc_is "$exp-st" 0 || return 1
    for i in $(seq 1 "$n"); do
        [ "$(sql "select state, backend_job_id from runs where run_id = '$exp-$i'")" = "running|$(job_of "$exp" "$n" "$i")" ] ||
            { sql "select run_id, state, backend_job_id from runs"; cat "$exp-st.err"; return 1; }
        grep -q "^$exp-$i *running .*$(job_of "$exp" "$n" "$i")" "$exp-st.out" || { cat "$exp-st.out"; return 1; }
    done
}
adopt_ok() {
    local exp=$1 n=$2 id i want
    rc_is "$exp-res" 0 || return 1
    id=$(cat sbatch_ids)
    for i in $(seq 1 "$n"); do
        want=$id
        [ "$n" -gt 1 ] && want="${id}_$((i - 1))"
        [ "$(sql "select state, backend_job_id, attempts from runs where run_id = '$exp-$i'")" = "completed|$want|1" ] ||
            { sql "select run_id, state, backend_job_id, attempts from runs"; cat "$exp-res.err"; return 1; }
    done
    [ "$(grep -c "^sbatch .*job-name=$exp-" calls.log)" = 1 ] || { echo "submitted more than once"; return 1; }
    [ "$(sql "select count(*) from runs r join experiments e on e.id = r.experiment_id where e.name = '$exp'")" = "$n" ]
}
adopt sljobs-adopt 1
adopt sljobs-adoptarr 3
