#!/usr/bin/env bash
# tests/gpu/run.sh - what runs on the GPU machine: builds the CUDA kernels, the GPU test
# and the GEMM benchmark (make gpu-tests), runs the test twice (two fresh seeds: a
# result that moves between runs is a race), optionally under compute-sanitizer, then
# the benchmark, and prints a pass/fail table.  Logs go to $OUT (or build/gpu-out).
#   tests/gpu/run.sh            test + memcheck + benchmark
#   BENCH=0 tests/gpu/run.sh    test only
set -u
cd "$(dirname "$0")/../.."
out=${OUT:-build/gpu-out}
mkdir -p "$out"
export OMP_WAIT_POLICY=passive
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee "$out/gpu.txt"
nvcc --version | tail -1
if ! make -j"$(nproc)" gpu-tests >"$out/build.log" 2>&1; then
    tail -40 "$out/build.log"
    echo "BUILD FAILED"
    exit 1
fi
status=0
for run in 1 2; do
    build/tests/gpu/test_kernels_gpu >"$out/test$run.log" 2>&1 || status=1
done
if [ "${MEMCHECK:-1}" = 1 ] && command -v compute-sanitizer >/dev/null; then
    timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 \
        build/tests/gpu/test_kernels_gpu >"$out/memcheck.log" 2>&1
    echo "compute-sanitizer memcheck exit $? (log: memcheck.log; last lines:)"
    tail -3 "$out/memcheck.log"
fi
if [ "${BENCH:-1}" = 1 ]; then
    build/bench/bench_gemm_gpu >"$out/bench.log" 2>&1 || status=1
    cat "$out/bench.log"
fi
for run in 1 2; do
    echo "== test run $run: $(grep -m1 '^# device' "$out/test$run.log")"
    awk '/^(not )?ok /{ st = ($1 == "ok") ? "PASS" : "FAIL"; if ($0 ~ /# SKIP/) st = "SKIP";
                        name = $0; sub(/^(not )?ok [0-9]+ - /, "", name); sub(/ #.*/, "", name);
                        note = $0; if (!sub(/^[^#]*# ?/, "", note)) note = "";
                        printf "%-18s %-4s %s\n", name, st, note }' "$out/test$run.log"
    grep -E '^# (replay|.*relative L2|.*error|.*returned)' "$out/test$run.log" | head -20
    echo "$(grep -c '^ok ' "$out/test$run.log") passed, $(grep '^not ok ' "$out/test$run.log" | grep -cv '# SKIP') failed, $(grep -c '^not ok .*# SKIP' "$out/test$run.log") skipped"
done
exit $status
