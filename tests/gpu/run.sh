#!/usr/bin/env bash
# tests/gpu/run.sh - what runs on the GPU machine: builds the CUDA kernels, the GPU tests
# (tests/gpu/test_*.cu) and benchmarks (contrib/bench/*_gpu.cu) with make gpu-tests, runs
# every test twice (two fresh seeds: a result that moves between runs is a race),
# optionally under compute-sanitizer, then the benchmarks, and prints a pass/fail table.
# Logs go to $OUT (or build/gpu-out).
#   tests/gpu/run.sh            test + memcheck + benchmark
#   BENCH=0 tests/gpu/run.sh    test only
#   GPU_MAKE=0 tests/gpu/run.sh use the build/ already there (built elsewhere and carried)
set -u
cd "$(dirname "$0")/../.."
out=${OUT:-build/gpu-out}
mkdir -p "$out"
export OMP_WAIT_POLICY=passive
# The cuda device backend that kdev_create(KDEV_CUDA) loads (test_kdev_gpu).
export HEARTH_CUDA_LIB=$PWD/build/lib/libhearth_cuda.so
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee "$out/gpu.txt"
nvcc --version | tail -1
if [ "${GPU_MAKE:-1}" = 1 ] && ! make -j"$(nproc)" gpu-tests >"$out/build.log" 2>&1; then
    tail -40 "$out/build.log"
    echo "BUILD FAILED"
    exit 1
fi
status=0
tests=$(ls build/tests/gpu/test_* 2>/dev/null)
# hearth-train with device: cuda (tests/gpu/train_gpu.sh) where the trainer was built
# (it needs libyaml and jansson headers: build it beside, carry build/bin and the shared
# libraries it lacks, with LD_LIBRARY_PATH).
[ -x build/bin/hearth-train ] && tests="$tests tests/gpu/train_gpu.sh"
for run in 1 2; do
    for t in $tests; do
        "$t" >"$out/$(basename "$t").$run.log" 2>&1 || status=1
    done
done
if [ "${MEMCHECK:-1}" = 1 ] && command -v compute-sanitizer >/dev/null; then
    for t in $tests; do
        case $t in *.sh) continue ;; esac
        timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 \
            "$t" >"$out/$(basename "$t").memcheck.log" 2>&1
        echo "compute-sanitizer memcheck $(basename "$t"): exit $? (last lines:)"
        tail -2 "$out/$(basename "$t").memcheck.log"
    done
fi
if [ "${BENCH:-1}" = 1 ]; then
    for b in build/bench/*_gpu; do
        [ -x "$b" ] || continue
        "$b" >"$out/$(basename "$b").log" 2>&1 || status=1
        cat "$out/$(basename "$b").log"
    done
fi
pass=0 fail=0 skip=0
for run in 1 2; do
    for t in $tests; do
        log="$out/$(basename "$t").$run.log"
        echo "== $(basename "$t") run $run: $(grep -m1 '^# device' "$log")"
        awk '/^(not )?ok /{ st = ($1 == "ok") ? "PASS" : "FAIL"; if ($0 ~ /# SKIP/) st = "SKIP";
                            name = $0; sub(/^(not )?ok [0-9]+ - /, "", name); sub(/ #.*/, "", name);
                            note = $0; if (!sub(/^[^#]*# ?/, "", note)) note = "";
                            printf "%-28s %-4s %s\n", name, st, note }' "$log"
        grep -E '^# (replay|.*relative L2|.*error|.*returned)' "$log" | head -20
        pass=$((pass + $(grep -c '^ok ' "$log")))
        fail=$((fail + $(grep '^not ok ' "$log" | grep -cv '# SKIP')))
        skip=$((skip + $(grep -c '^not ok .*# SKIP' "$log")))
    done
done
echo "$pass passed, $fail failed, $skip skipped"
exit $status
