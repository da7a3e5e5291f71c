#!/usr/bin/env bash
# `hearth bench layers` through the slurm (and slurmrest) backend on the test cluster: the
# real hearth-train measures tiny-vlm on the cpu in one Slurm job (one task, no GPU) and
# its layer_bench.json is recorded with device, GPU, build and date; the benchmark's
# directory is no run (`hearth ingest` passes it over).  A job whose trainer exits 1
# (after leaving a layer_bench.json behind) fails naming the job id and its log, and
# records nothing; so does a job cancelled by --timeout.  From a SPEC: the first point the
# plan keeps, with the spec's trainer, setup lines, partition, time and --set overrides;
# on cuda one task with --gpus-per-node=1 whatever the layout's size (a stand-in trainer
# writes the file: there is no GPU here, the cluster's are simulated).
set -u
cd "$(dirname "$0")/../.."
. tests/cli/hearth_slurm_common.bash
slurm_test slurm-bench bench-layers-
slurmrest_setup

tap_plan 10

# job_of NAME: the job id that `hearth bench layers` reported in NAME.err.
job_of() { sed -n 's/^hearth: bench layers: job \([0-9_]*\) submitted.*/\1/p' "$T/$1.err"; }
sets() { sql "select count(*) from layer_bench_sets"; }

run_h cpu bench layers --model tiny-vlm --device cpu --backend slurm
CPU_DIR=$(ls -d runs/bench-layers/tiny-vlm-* 2>/dev/null | head -1)
cpu_ok() {
    rc_is cpu 0 || return 1
    local id; id=$(job_of cpu)
    [ -n "$id" ] && grep -q "^hearth: bench layers: job $id running on n[12]$" cpu.err &&
        grep -q "^hearth: bench layers: job $id ended with exit code 0 after " cpu.err &&
        grep -q 'tiny-vlm on cpu, device cpu, 44 rows' cpu.out || { cat cpu.out cpu.err; return 1; }
    [ "$(sql "select gpu, model, device, build like '0.%', measured_at like '____-__-__T%', source from layer_bench_sets")" = \
      "cpu|tiny-vlm|cpu|1|1|$T/$CPU_DIR/layer_bench.json" ] || { sql "select * from layer_bench_sets"; return 1; }
    [ "$(sql "select count(*), count(fp8_err) from layer_bench")" = "44|44" ] || return 1
    # ran on a node of the cluster, as a hearth job of its own
    [ "$(jq -r '.mode + " " + .backend' "$CPU_DIR/job.json")" = "bench-layers slurm" ] &&
        grep -qx 'n[12]' "$CPU_DIR/nodes" && [ "$(cat "$CPU_DIR/exit_code")" = 0 ] ||
        { cat "$CPU_DIR/job.json"; return 1; }
}
tap_check "bench layers --model tiny-vlm --device cpu --backend slurm: one job on a node, 44 rows recorded with device, build, date" cpu_ok

cpu_sbatch_ok() {
    [ "$(calls sbatch)" = 1 ] || { cat calls.log; return 1; }
    grep -q '^sbatch --parsable --job-name=bench-layers-tiny-vlm-[0-9]* .*--nodes=1 --ntasks=1 .*--cpus-per-task=1 ' calls.log &&
        ! grep -q -- '--gpus-per-node' calls.log || { grep '^sbatch' calls.log; return 1; }
    grep -q -- '--bench-layers' "$CPU_DIR/job.sh" && [ "$(jq -r .device "$CPU_DIR/run.yaml")" = cpu ] ||
        { cat "$CPU_DIR/job.sh"; return 1; }
}
tap_check "the job: one sbatch (one task, no GPU) of the run's job script, whose trainer runs --bench-layers" cpu_sbatch_ok

run_h ing ingest runs
run_h ing1 ingest "$CPU_DIR"
not_a_run_ok() {
    rc_is ing 2 && grep -q 'no run directories' ing.err || { cat ing.out ing.err; return 1; }
    rc_is ing1 2 && grep -q "a layer benchmark's directory, not a run's: .hearth bench ingest .*/layer_bench.json" ing1.err ||
        { cat ing1.err; return 1; }
    [ "$(sql "select count(*) from runs")" = 0 ]
}
tap_check "hearth ingest passes a benchmark's directory over (it is no run) and names it when asked" not_a_run_ok

# A trainer that has the mode, leaves a file behind and fails.
cat >fail.sh <<EOF
#!/bin/bash
[ "\$1" = --help ] && { echo "  --bench-layers  (stand-in)"; exit 0; }
while [ \$# -gt 0 ]; do case "\$1" in --out) out=\$2; shift 2 ;; *) shift ;; esac; done
cp "$T/$CPU_DIR/layer_bench.json" "\$out/layer_bench.json"
sed -i 's/"build": "/"build": "x/' "\$out/layer_bench.json"
echo "hearth-train: bench-layers: the device went away" >&2
exit 1
EOF
chmod +x fail.sh
run_h fail bench layers --model tiny-vlm --device cpu --backend slurm --trainer ./fail.sh
fail_ok() {
    rc_is fail 1 || return 1
    local id dir; id=$(job_of fail); dir=$(ls -d "$T"/runs/bench-layers/tiny-vlm-* | grep -v "$CPU_DIR")
    grep -q "bench layers: job $id (slurm backend) failed with exit code 1; nothing was recorded; its log: $dir/stderr.log, which ends: hearth-train: bench-layers: the device went away" fail.err ||
        { cat fail.err; return 1; }
    [ -f "$dir/layer_bench.json" ] && [ "$(sets)" = 1 ] && [ "$(sql "select count(*) from layer_bench")" = 44 ] ||
        { sql "select source from layer_bench_sets"; return 1; }
}
tap_check "a job whose trainer exits 1: the error names the job id, its log and last line; its file is not recorded" fail_ok

cat >slow.sh <<'EOF'
#!/bin/bash
[ "$1" = --help ] && { echo "  --bench-layers  (stand-in)"; exit 0; }
exec sleep 300
EOF
chmod +x slow.sh
run_h slow bench layers --model tiny-vlm --device cpu --backend slurm --trainer ./slow.sh --timeout 2
slow_ok() {
    rc_is slow 1 || return 1
    local id; id=$(job_of slow)
    grep -q "^hearth: bench layers: job $id still running after 2s: cancelling it" slow.err &&
        grep -q "job $id (slurm backend) did not end within --timeout 2s and was cancelled; nothing was recorded; its log: " slow.err ||
        { cat slow.err; return 1; }
    grep -q "^scancel $id\$" calls.log && [ "$(sets)" = 1 ] || { cat calls.log; return 1; }
    [ -z "$(real squeue -h -j "$id" -t pending,running 2>/dev/null)" ]
}
tap_check "--timeout 2: the job is cancelled (scancel), the error says so, nothing is recorded" slow_ok

# SPEC, cpu, the real trainer: the first kept point (seq_len 64 from the matrix and --set
# micro_batch), the spec's resources.
cat >cpu.yaml <<EOF
name: bench-layers-cpu
$TINY_BASE
  device: cpu
resources: {cpus_per_task: 2, time: "00:04:00", partition: debug, setup: ["export BENCH_SETUP=yes"]}
matrix:
  train.seq_len: [64, 128]
EOF
: >calls.log
run_h spec bench layers cpu.yaml --backend slurm --set train.micro_batch=2 --set train.global_batch=2
spec_ok() {
    rc_is spec 0 || return 1
    local dir; dir=$(sed -n 's/^hearth: bench layers: job [0-9]* submitted (slurm backend; \(.*\))$/\1/p' spec.err)
    [ "$(jq -c '[.device, .train.seq_len, .train.micro_batch]' "$dir/run.yaml")" = '["cpu",64,2]' ] ||
        { cat spec.err; cat "$dir/run.yaml"; return 1; }
    grep -q '^sbatch .*--nodes=1 --ntasks=1 .*--cpus-per-task=2 --time=4 .*--partition=debug ' calls.log &&
        grep -q 'export BENCH_SETUP=yes' "$dir/job.sh" || { cat calls.log; return 1; }
    # 128 tokens a micro batch: the decoder's counts are 32..256
    [ "$(sets)" = 2 ] &&
        [ "$(jq -c '[.rows[] | select(.component == "decoder" and .kind == "fc1") | .tokens]' "$dir/layer_bench.json")" = '[32,64,128,256]' ] &&
        [ "$(sql "select count(*) from layer_bench_sets where source = '$dir/layer_bench.json' and device = 'cpu'")" = 1 ] ||
        { sql "select source, device from layer_bench_sets"; return 1; }
}
tap_check "bench layers SPEC (cpu): its first point with --set applied, the spec's cpus, time, partition and setup; recorded" spec_ok

# SPEC, cuda: a layout of 2 nodes x 2 GPUs with tp 2 measures on one GPU at tp 2.
cat >gpu.sh <<EOF
#!/bin/bash
[ "\$1" = --help ] && { echo "  --bench-layers  (stand-in)"; exit 0; }
[ "\$1" = --capabilities ] && { echo '{"devices": ["cpu", "cuda"]}'; exit 0; }
cfg= out=
while [ \$# -gt 0 ]; do case "\$1" in --config) cfg=\$2; shift 2 ;; --out) out=\$2; shift 2 ;; *) shift ;; esac; done
[ -n "\$cfg" ] && [ -n "\$out" ] || exit 2
env | grep -E '^(SLURM_|CUDA_)' | sort >"\$out/env.txt"
tp=\$(jq .parallel.tp "\$cfg")
echo "procid=\${SLURM_PROCID-} ntasks=\${SLURM_NTASKS-} gpus=\${SLURM_GPUS_ON_NODE-} setup=\${BENCH_SETUP-}" >"\$out/task.txt"
cat >"\$out/layer_bench.json" <<JSON
{"gpu": "NVIDIA H100 80GB HBM3", "device": "cuda", "build": "0.9.9 (stand-in)", "date": "2026-01-02T03:04:05Z",
 "model": "tiny-vlm", "rows": [
  {"component": "decoder", "kind": "fc1", "tp": \$tp, "tokens": 1024, "bf16_ms": 2, "fp8_ms": 1, "repeats": 20, "fp8_err": 0.05}]}
JSON
EOF
chmod +x gpu.sh
cat >gpu.yaml <<EOF
name: bench-layers-gpu
trainer: ./gpu.sh
base:
  model: tiny-vlm
  device: cuda
  ranks: 4
  parallel: {tp: 2}
  train: {steps: 3, seq_len: 32, micro_batch: 1, global_batch: 2}
resources: {nodes: 2, gpus_per_node: 2, setup: ["export BENCH_SETUP=yes"]}
EOF
: >calls.log
run_h gpu bench layers gpu.yaml --backend slurm
gpu_ok() {
    rc_is gpu 0 || return 1
    local dir; dir=$(sed -n 's/^hearth: bench layers: job [0-9]* submitted (slurm backend; \(.*\))$/\1/p' gpu.err)
    grep -q '^sbatch .*--nodes=1 --ntasks-per-node=1 --gpus-per-node=1 ' calls.log &&
        ! grep -q -- '--nodes=2' calls.log || { grep '^sbatch' calls.log; return 1; }
    grep -qx 'procid=0 ntasks=1 gpus=1 setup=yes' "$dir/task.txt" || { cat "$dir/task.txt" "$dir/stderr.log"; return 1; }
    [ "$(sql "select gpu, device, build, measured_at from layer_bench_sets where source = '$dir/layer_bench.json'")" = \
      "NVIDIA H100 80GB HBM3|cuda|0.9.9 (stand-in)|2026-01-02T03:04:05Z" ] &&
        [ "$(sql "select tp from layer_bench where bf16_ms = 2")" = 2 ] || { sql "select * from layer_bench_sets"; return 1; }
    grep -q 'tiny-vlm on NVIDIA H100 80GB HBM3, device cuda, 1 rows' gpu.out || { cat gpu.out; return 1; }
}
tap_check "bench layers SPEC (cuda, 2 nodes x 2 GPUs, tp 2): one task with --gpus-per-node=1, the layout's tp, GPU and build recorded" gpu_ok

run_h rest bench layers --model tiny-vlm --device cpu --backend slurmrest --trainer ./gpu.sh
rest_ok() {
    rc_is rest 0 || return 1
    grep -q '^hearth: bench layers: job [0-9]* submitted (slurmrest backend; ' rest.err &&
        grep -q 'tiny-vlm on NVIDIA H100 80GB HBM3, device cuda, 1 rows$' rest.out && [ "$(sets)" = 4 ] ||
        { cat rest.out rest.err; return 1; }
}
tap_check "--backend slurmrest: the same job through slurmrestd, its file ingested" rest_ok

run_h both bench layers cpu.yaml --model tiny-vlm
run_h dev bench layers cpu.yaml --device cpu
run_h set bench layers --model tiny-vlm --set train.seq_len=64
run_h none bench layers
run_h pruned bench layers cpu.yaml --set train.micro_batch=2
usage_ok() {
    rc_is both 2 && grep -q 'bench layers cpu.yaml: --model: a SPEC names the model, device and trainer itself' both.err &&
        rc_is dev 2 && grep -q -- '--device: a SPEC names' dev.err &&
        rc_is set 2 && grep -q -- '--set: overrides keys of a SPEC' set.err &&
        rc_is none 2 && grep -q 'expected SPEC or --model M' none.err &&
        rc_is pruned 2 && grep -q 'cpu.yaml: the plan keeps no point to benchmark; the first point was pruned by rule [a-z_]*: ' pruned.err ||
        { cat both.err dev.err set.err none.err pruned.err; return 1; }
    [ "$(calls sbatch)" = 1 ]
}
tap_check "usage: SPEC with --model or --device, --set without SPEC, neither, a SPEC whose points are all pruned: errors, nothing submitted" usage_ok

run_h bad bench layers --model tiny-vlm --device cpu --backend slurm --trainer "$TRAIN_ABS" --timeout 0
bad_ok() {
    rc_is bad 2 && grep -q -- '--timeout' bad.err || { cat bad.err; return 1; }
    [ "$(calls sbatch)" = 1 ]
}
tap_check "--timeout 0 is a usage error" bad_ok
