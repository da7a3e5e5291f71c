#!/usr/bin/env bash
# contrib/bench/run_step_gpu.sh - the GPT-2 124M training-step benchmark on one GPU:
# builds bench_step_gpu, runs it and the PyTorch baseline (gpt2_torch.py, torch.compile)
# with the same shapes, and prints one side-by-side table.  Options are passed to both
# (--batch, --micro, --seq, --steps, --warmup, --layers, --hidden, --heads, --vocab, --peak).
# Then one run of bench_step_gpu with --profile: the per-phase table of the step.
# Logs go to $OUT (or build/gpu-out).  Exit status 1 when either side failed.
#   contrib/bench/run_step_gpu.sh                      # B 64 x T 1024
#   contrib/bench/run_step_gpu.sh --batch 64 --micro 32
set -u
cd "$(dirname "$0")/../.."
out=${OUT:-build/gpu-out}
mkdir -p "$out"
if ! make -j"$(nproc)" build/bench/bench_step_gpu >"$out/step_build.log" 2>&1; then
    tail -40 "$out/step_build.log"
    echo "BUILD FAILED"
    exit 1
fi
status=0
build/bench/bench_step_gpu "$@" 2>&1 | tee "$out/bench_step_gpu.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
python3 contrib/bench/gpt2_torch.py "$@" 2>&1 | tee "$out/gpt2_torch.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
echo
echo "GPT-2 124M training step, one GPU (tokens/s higher is better)"
grep -h '^RESULT ' "$out/bench_step_gpu.log" "$out/gpt2_torch.log" | awk '
    { name[NR] = $2; tok[NR] = $3; ms[NR] = $4; mfu[NR] = $5; mem[NR] = $6; l0[NR] = $7; l1[NR] = $8 }
    $2 == "torch" { ref = $3 }
    END {
        printf "%-8s %10s %12s %7s %10s %17s %9s\n", "", "ms/step", "tokens/s", "MFU%", "mem GiB",
               "loss first->last", "vs torch"
        for (i = 1; i <= NR; i++)
            printf "%-8s %10.2f %12.0f %7.1f %10.2f %8.4f->%-8.4f %8s\n", name[i], ms[i], tok[i],
                   mfu[i], mem[i], l0[i], l1[i], ref ? sprintf("%.2fx", tok[i] / ref) : "-"
    }'
echo "(mem: hearth = device memory used by the run; torch = max_memory_allocated)"
# Where hearth's step spends its time: one more run with the step's CUDA events on
# (timed separately, so the numbers above are unprofiled).
echo
echo "hearth step, per phase (CUDA events summed per kind of work)"
build/bench/bench_step_gpu "$@" --warmup 1 --steps 1 --profile >"$out/bench_step_gpu_profile.log" 2>&1 ||
    status=1
grep -h '^PHASE ' "$out/bench_step_gpu_profile.log" | sed 's/^PHASE //'
exit "$status"
