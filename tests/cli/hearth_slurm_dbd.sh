#!/usr/bin/env bash
# The slurm backend on a cluster that keeps accounting: contrib/slurm-local started with
# --with-dbd (slurmdbd + MariaDB; make test starts this second instance in
# $HEARTH_SLURM_DBD_DIR, default /tmp/hearth-slurm-dbd).  A sweep of 6 tiny-vlm runs, two
# of which lose their job script to SIGKILL (no exit code file: only Slurm knows how they
# ended), goes through sbatch; hearth learns those two ends from one batched sacct per poll
# cycle (never scontrol show job), and every poll cycle is one squeue plus at most one
# sacct, counted through wrappers on PATH.  Results land in SQLite and agree with sacct.
set -u
cd "$(dirname "$0")/../.."
. tests/cli/hearth_slurm_common.bash
slurm_test slurm-dbd sldbd dbd

tap_plan 6

# The trainer of runs 2 and 5 kills its job script (its parent) outright: the job ends
# FAILED with signal 9 and leaves no RUN_DIR/exit_code.
cat >killer.sh <<EOF
#!/bin/bash
case "\$HEARTH_RUN_ID" in
*-2|*-5) kill -9 "\$PPID"; exit 0 ;;
esac
exec "$TRAIN_ABS" "\$@"
EOF
chmod +x killer.sh

accounting=$(real scontrol show config 2>/dev/null | awk '$1 == "AccountingStorageType" {print $3}')
acct_ok() { [ "$accounting" = accounting_storage/slurmdbd ] || { echo "# AccountingStorageType '$accounting'"; return 1; }; }
tap_check "the cluster keeps accounting (AccountingStorageType=accounting_storage/slurmdbd)" acct_ok

cat >d.yaml <<EOF
name: sldbd
trainer: ./killer.sh
$TINY_BASE
matrix:
  train.seed: [1, 2, 3, 4, 5, 6]
EOF
start=$(( $(date +%s%N) / 1000000 ))
run_h sw submit d.yaml --backend slurm
end=$(( $(date +%s%N) / 1000000 ))

sweep_ok() {
    [ "$(sql "select run_id || ' ' || state || ' ' || ifnull(exit_code, '-') from runs order by run_id")" = \
"sldbd-1 completed 0
sldbd-2 failed 137
sldbd-3 completed 0
sldbd-4 completed 0
sldbd-5 failed 137
sldbd-6 completed 0" ] || { sql "select run_id, state, exit_code from runs"; cat sw.err; return 1; }
    [ ! -e runs/sldbd/sldbd-2/exit_code ] && [ ! -e runs/sldbd/sldbd-5/exit_code ] &&
        grep -q '4 completed, 2 failed' sw.out || { cat sw.out; return 1; }
}
tap_check "6 runs: 4 completed, the 2 whose job script was killed failed with 137 (128 + SIGKILL)" sweep_ok

ingest_ok() {
    [ "$(sql "select count(*) from results r join runs u on u.id = r.run where r.tokens_per_s > 0 and u.state = 'completed'")" = 4 ] &&
        [ "$(sql "select count(distinct run) from run_config_kv")" = 6 ] || { sql "select * from results"; return 1; }
}
tap_check "the 4 completed runs ingested (throughput in SQLite), every run's config flattened" ingest_ok

agree_ok() {
    # What the database says of each job is what accounting says.
    local run job want got
    while IFS='|' read -r run job want; do
        got=$(real sacct -n -P -X -j "$job" -o State,ExitCode | head -n 1)
        case "$want" in
        completed) [ "$got" = "COMPLETED|0:0" ] ;;
        failed) [ "$got" = "FAILED|0:9" ] ;;
        esac || { echo "# $run ($job): database $want, sacct $got"; return 1; }
    done < <(sql "select run_id, backend_job_id, state from runs")
}
tap_check "every job's end in the database agrees with sacct" agree_ok

poll_ok() {
    local n s ms max
    n=$(calls squeue)
    s=$(calls sacct)
    ms=$((end - start))
    max=$((ms / HEARTH_SLURM_POLL_MS + 2))
    [ "$n" -ge 1 ] && [ "$n" -le "$max" ] || { echo "# $n squeue calls in ${ms} ms (max $max)"; return 1; }
    # sacct asked (the killed jobs needed it), each time right after a squeue: at most one
    # per cycle, and only for jobs that ended without an exit code file.
    [ "$s" -ge 1 ] || { echo "# no sacct call"; grep -v '^squeue' calls.log; return 1; }
    grep -E '^(squeue|sacct) ' calls.log | awk '$1 == "sacct" && prev == "sacct" {bad = 1} {prev = $1} END {exit bad}' ||
        { grep -E '^(squeue|sacct) ' calls.log; return 1; }
    local j2 j5
    j2=$(sql "select backend_job_id from runs where run_id = 'sldbd-2'")
    j5=$(sql "select backend_job_id from runs where run_id = 'sldbd-5'")
    ! grep '^sacct ' calls.log | grep -oE -- '--jobs [^ ]+' | tr ', ' '\n\n' | grep -vxE -- "--jobs|$j2|$j5" ||
        { grep '^sacct ' calls.log; return 1; }
}
tap_check "poll cost: one squeue per cycle, at most one sacct right after it, only for the killed jobs" poll_ok

noctl_ok() {
    # Accounting replaces scontrol show job: scontrol only read the config (once).
    [ "$(grep -c '^scontrol ' calls.log)" = 1 ] && grep -q '^scontrol show config' calls.log ||
        { grep '^scontrol' calls.log; return 1; }
}
tap_check "no scontrol show job with accounting (one scontrol show config)" noctl_ok
