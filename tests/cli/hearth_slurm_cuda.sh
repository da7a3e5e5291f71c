#!/usr/bin/env bash
# device cuda runs through the slurm backend on the test cluster (contrib/slurm-local, whose
# nodes declare 2 simulated GPUs each): a spec with nodes 2, gpus_per_node 2, ranks 4 goes
# as one sbatch with --nodes=2 --ntasks-per-node=2 --gpus-per-node=2, and its job script
# starts 4 tasks with `srun --mpi=pmix`.  The trainer stands in for hearth-train (which
# cannot run cuda here): each task records its Slurm and PMIx rank and node, then runs
# `hearth-train --check-bootstrap`, a PMIx all-gather among the 4 ranks that passes only if
# every rank saw every other.  Rank 0's --out is the run directory, rank R's RUN_DIR/rank-R.
# The check writes no result.json, so the run that ran to exit 0 is recorded failed ("exit 0
# but no result.json").
# Also: ranks that disagree with nodes x gpus_per_node are pruned at plan time (rule
# ranks_match_gpus); the local backend refuses a cuda run of several ranks.
set -u
cd "$(dirname "$0")/../.."
. tests/cli/hearth_slurm_common.bash
slurm_test slurm-cuda slcuda

tap_plan 7

cat >"$T/ranks.sh" <<EOF
#!/bin/bash
out=
while [ \$# -gt 0 ]; do
    case "\$1" in --out) out=\$2; shift 2 ;; *) shift ;; esac
done
mkdir -p "\$out" "\$HEARTH_RUN_DIR/tasks" || exit 1
printf 'procid=%s pmix_rank=%s node=%s local=%s ntasks=%s out=%s\n' "\${SLURM_PROCID-}" \\
    "\${PMIX_RANK-}" "\${SLURMD_NODENAME-}" "\${SLURM_LOCALID-}" "\${SLURM_NTASKS-}" "\$out" \\
    >"\$HEARTH_RUN_DIR/tasks/\${SLURM_PROCID-none}"
exec "$TRAIN_ABS" --check-bootstrap >"\$out/bootstrap.txt" 2>&1
EOF
chmod +x "$T/ranks.sh"

cuda_spec() {   # cuda_spec NAME NODES GPUS RANKS
    cat <<EOF
name: $1
trainer: ./ranks.sh
base:
  model: tiny-vlm
  device: cuda
  ranks: $4
  train: {steps: 3, seq_len: 32, micro_batch: 1, global_batch: 4}
resources: {nodes: $2, gpus_per_node: $3, time: "00:02:00"}
EOF
}

cuda_spec slcuda 2 2 4 >c.yaml
run_h c submit c.yaml --backend slurm
D=runs/slcuda/slcuda-1

ran_ok() {
    rc_is c 1 || return 1
    [ "$(sql "select state, backend, exit_code from runs")" = "failed|slurm|0" ] ||
        { sql "select run_id, state, backend, exit_code from runs"; cat "$D/stdout.log" "$D/stderr.log"; return 1; }
    [ "$(cat "$D/exit_code")" = 0 ] &&
        [ "$(sql "select count(*) from run_events where note = 'exit 0 but no result.json'")" = 1 ] ||
        { sql "select to_state, note from run_events"; return 1; }
}
tap_check "nodes 2 x gpus_per_node 2, ranks 4: the job ran to exit 0 (SQLite and RUN_DIR/exit_code); no result.json, so failed" ran_ok

sbatch_ok() {
    [ "$(grep -c '^sbatch ' calls.log)" = 1 ] &&
        grep -q '^sbatch .* --nodes=2 --ntasks-per-node=2 --gpus-per-node=2 .*--cpus-per-task=1 ' calls.log &&
        ! grep -q -- '--ntasks=1' calls.log || { grep '^sbatch' calls.log; return 1; }
    grep -q "srun --mpi=pmix --kill-on-bad-exit=1" "$D/job.sh" || { cat "$D/job.sh"; return 1; }
}
tap_check "one sbatch with --nodes=2 --ntasks-per-node=2 --gpus-per-node=2; job.sh launches srun --mpi=pmix" sbatch_ok

tasks_ok() {
    local r f
    [ "$(ls "$D/tasks" | sort | tr '\n' ' ')" = "0 1 2 3 " ] || { ls "$D/tasks"; return 1; }
    for r in 0 1 2 3; do
        f=$D/tasks/$r
        grep -q "^procid=$r pmix_rank=$r node=n[0-9]* local=[01] ntasks=4 " "$f" || { cat "$f"; return 1; }
    done
    # 2 nodes, 2 tasks on each, local ranks 0 and 1 on each.
    [ "$(sed -n 's/.* node=\([^ ]*\) .*/\1/p' "$D"/tasks/* | sort | uniq -c | awk '{print $1}' | tr '\n' ' ')" = "2 2 " ] &&
        [ "$(sed -n 's/.* node=\([^ ]*\) local=\([01]\) .*/\1 \2/p' "$D"/tasks/* | sort -u | wc -l)" = 4 ] ||
        { cat "$D"/tasks/*; return 1; }
    grep -qx 'n\[1-2\]' "$D/nodes" || { cat "$D/nodes"; return 1; }
}
tap_check "4 tasks over 2 nodes: SLURM_PROCID = PMIX_RANK = 0..3, local ranks 0 and 1 on each node; RUN_DIR/nodes n[1-2]" tasks_ok

bootstrap_ok() {
    local r f
    for r in 0 1 2 3; do
        f=$D/rank-$r/bootstrap.txt
        [ "$r" = 0 ] && f=$D/bootstrap.txt
        grep -q "procid=$r .* out=.*/${f%/bootstrap.txt}\$" "$D/tasks/$r" &&
            grep -q "bootstrap pmix: rank $r of 4, local rank" "$f" &&
            grep -q "bootstrap check passed: 4 ranks, identical views" "$f" || { echo "$f:"; cat "$f"; return 1; }
    done
    [ ! -e "$D/rank-0" ]
}
tap_check "hearth-train --check-bootstrap under the job's srun: a PMIx all-gather among the 4 ranks passed; rank 0 wrote RUN_DIR, rank R RUN_DIR/rank-R" bootstrap_ok

# ---- ranks that disagree with the resources: pruned at plan time ----
cuda_spec slcuda-bad 2 2 8 >b.yaml
run_h bp plan b.yaml
run_h bs submit b.yaml --backend slurm
pruned_ok() {
    rc_is bp 0 && grep -q 'ranks_match_gpus' bp.out &&
        grep -q 'ranks 8 must equal resources.nodes 2 x resources.gpus_per_node 2 = 4' bp.out ||
        { cat bp.out bp.err; return 1; }
    [ "$(sql "select count(*) from runs r join experiments e on e.id = r.experiment_id where e.name = 'slcuda-bad'")" = 0 ] &&
        [ "$(grep -c '^sbatch ' calls.log)" = 1 ] || { cat bs.out bs.err; return 1; }
}
tap_check "ranks 8 with nodes 2 x gpus_per_node 2: pruned by rule ranks_match_gpus, nothing submitted" pruned_ok

# ---- the local backend: one rank of cuda at most ----
cuda_spec slcuda-local 1 2 2 >l.yaml
run_h l submit l.yaml --backend local
local_ok() {
    grep -q 'resources.gpus_per_node 2' l.out l.err && grep -q -- '--backend slurm' l.out l.err ||
        { cat l.out l.err; return 1; }
    [ "$(sql "select r.state from runs r join experiments e on e.id = r.experiment_id where e.name = 'slcuda-local'")" = failed ] &&
        [ ! -e runs/slcuda-local/slcuda-local-1/tasks ] && [ ! -e runs/slcuda-local/slcuda-local-1/exit_code ]
}
tap_check "local backend: cuda with 2 ranks refused, naming resources.gpus_per_node (never started)" local_ok

# ---- a CPU run beside it keeps its one-task shape ----
cat >cpu.yaml <<EOF
name: slcuda-cpu
$TINY_BASE
resources: {nodes: 2, gpus_per_node: 2, cpus_per_task: 2, time: "00:02:00"}
EOF
run_h p submit cpu.yaml --backend slurm
cpu_ok() {
    rc_is p 0 || return 1
    [ "$(sql "select r.state from runs r join experiments e on e.id = r.experiment_id where e.name = 'slcuda-cpu'")" = completed ] &&
        grep '^sbatch ' calls.log | tail -n 1 | grep -q -- ' --nodes=1 --ntasks=1 .*--cpus-per-task=2 ' &&
        ! grep '^sbatch ' calls.log | tail -n 1 | grep -q -- '--gpus' &&
        ! grep -q 'srun' runs/slcuda-cpu/slcuda-cpu-1/stdout.log || { grep '^sbatch' calls.log; return 1; }
}
tap_check "device cpu (even with gpus_per_node 2): one task of cpus_per_task threads, no GPUs asked, completed" cpu_ok
