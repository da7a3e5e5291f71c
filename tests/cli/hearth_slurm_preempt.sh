#!/usr/bin/env bash
# Preemption under the slurm backend, on the test cluster (contrib/slurm-local, started by
# make test): once the run has written a few steps, `scancel --signal=USR2 --batch` sends
# the job script what `sbatch --signal=B:USR2@SECS` sends before the time limit; the script
# passes it to hearth-train, which writes a checkpoint and exits 75; hearth records the run
# `requeued` and submits it again, the job script sees checkpoints/latest and resumes
# (--resume RUN_DIR), and the run completes with bitwise the final loss of an
# uninterrupted run of the same config, each step once in metrics.jsonl.
set -u
cd "$(dirname "$0")/../.."
. tests/cli/hearth_slurm_common.bash
slurm_test slurm-preempt slpre

tap_plan 5

seed=${HEARTH_TEST_SEED:-$(( $(date +%s%N) % 100000 ))}
echo "# seed $seed (set HEARTH_TEST_SEED to repeat)"
cat >p.yaml <<EOF
name: slpre
trainer: ./trainer.sh
base:
  model: tiny-vlm
  train: {steps: 12, seq_len: 32, micro_batch: 1, global_batch: 2, warmup: 0, seed: $seed}
  data: {images_min: 1, images_max: 1, image_px_min: 16, image_px_max: 16}
resources: {time: "00:10:00"}
retries: 1
EOF
run_h sub submit p.yaml --backend slurm --detach
rd=runs/slpre/slpre-1
wait_for 120 bash -c "[ \"\$(wc -l <$rd/metrics.jsonl)\" -ge 3 ]"
job1=$(sql "select backend_job_id from runs where run_id = 'slpre-1'")
real scancel --signal=USR2 --batch "$job1"
run_h w wait slpre --timeout 240

diag() {
    sql "select r.run_id, e.to_state, e.exit_code, e.note from run_events e join runs r on r.id = e.run order by e.id"
    cat runs/slpre/runner.log 2>/dev/null; tail -n 5 "$rd"/*.log "$rd"/attempt-1/*.log 2>/dev/null
}
states_ok() {
    rc_is w 0 || { diag; return 1; }
    [ "$(sql "select state, attempts from runs where run_id = 'slpre-1'")" = "completed|2" ] || { diag; return 1; }
    [ "$(sql "select group_concat(to_state || ':' || ifnull(exit_code, ''), ',') from (select e.to_state, e.exit_code from run_events e join runs r on r.id = e.run where r.run_id = 'slpre-1' order by e.id)")" = "submitted:,running:,requeued:75,submitted:,running:,completed:0" ] ||
        { diag; return 1; }
}
tap_check "USR2 to the job script: exit 75 -> requeued -> submitted again -> completed" states_ok

sbatch_ok() {
    grep '^sbatch ' "$T/calls.log" | head -n 1 | grep -q -- '--signal=B:USR2@60 ' ||
        { grep '^sbatch ' "$T/calls.log"; return 1; }
}
tap_check "sbatch asks for USR2 before the time limit (--signal=B:USR2@60 for 10 minutes)" sbatch_ok

resume_ok() {
    grep -q 'checkpoint: ' "$rd/train.log" && grep -q 'resumed from .*/checkpoints/step-' "$rd/train.log" ||
        { tail -n 20 "$rd/train.log"; return 1; }
}
tap_check "the first attempt wrote a checkpoint, the second resumed from it" resume_ok

metrics_ok() {
    local steps; steps=$(sed -n 's/^{"step":\([0-9]*\),.*/\1/p' "$rd/metrics.jsonl" | tr '\n' ' ')
    [ "$steps" = "1 2 3 4 5 6 7 8 9 10 11 12 " ] || { echo "# steps: $steps"; return 1; }
}
tap_check "metrics.jsonl holds each step once" metrics_ok

loss_ok() {
    "$TRAIN_ABS" --config "$rd/run.yaml" --out "$T/ref" >/dev/null 2>"$T/ref.err" || { tail -3 "$T/ref.err"; return 1; }
    local want got
    want=$(sed -n 's/.*"final_loss": *\([^,]*\),*/\1/p' "$T/ref/result.json")
    got=$(sed -n 's/.*"final_loss": *\([^,]*\),*/\1/p' "$rd/result.json")
    [ -n "$want" ] && [ "$got" = "$want" ] || { echo "# final loss '$got', uninterrupted '$want'"; return 1; }
}
tap_check "the final loss equals an uninterrupted run's bitwise" loss_ok
