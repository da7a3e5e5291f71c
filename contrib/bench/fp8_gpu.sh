#!/usr/bin/env bash
# contrib/bench/fp8_gpu.sh - FP8 on one GPU (device: cuda) for the Qwen2.5-VL-3B shape, in
# one run, one table (docs/fp8.md, "Benchmark: contrib/bench/fp8_gpu.sh"):
#   1. hearth-train --bench-layers at the run's shape (every linear kind of the model, bf16
#      against FP8, at 1/4..2x the micro batch's token counts); its wall time is printed
#      (target: under 2 minutes for the whole model);
#   2. hearth bench ingest of its layer_bench.json into a scratch results database in $OUT,
#      then `precision.fp8: auto` resolved from it as `hearth plan` resolves it (the
#      orchestrator's evidence is printed), the policy file written by `hearth select fp8
#      --set ...` at the same per-component token counts;
#   3. STEPS training steps each, same seed and data: bf16 (precision.fp8=off), auto (the
#      resolved keys) and all (precision.fp8=all);
#   4. the table: run, policy, ms/step (result.json's median of the measured steps),
#      tokens/s, speedup vs bf16 (bf16's ms/step over the run's), loss after the last step
#      (metrics.jsonl), its difference vs bf16 in %, peak GiB; then the targets (auto >=
#      1.25x bf16's step, auto's loss within 1% of bf16's) and whether they were met.
# The shape is train_gpu.sh's vlm4096 row: sequence SEQ (4096) holding IMAGES (4) images of
# PX x PX (448) pixels, micro batch 1, train.recompute=RECOMPUTE (full), measured from step 2.
# FP8 combines with activation recomputation (a recomputed layer replays its forward's
# scales), so the three runs train with RECOMPUTE=full, which fits an 80 GB GPU;
# RECOMPUTE=none needs about 84 GiB by --plan-memory (an H200).  Should hearth-train refuse
# precision.fp8=all at the shape, the script says so first.
# Variables: OUT (build/gpu-out; files named fp8-*), MODEL (qwen2.5-vl-3b), SEQ, IMAGES, PX,
# STEPS (50), RECOMPUTE, SEED (1), DEVICE (cuda), HEARTH_TRAIN (build/bin/hearth-train),
# HEARTH (build/bin/hearth); TABLE_ONLY=1 runs nothing and prints the table of the runs
# already in $OUT.  A run that fails shows FAILED (or OOM) and the script exits 1.
# On the cpu (DEVICE=cpu MODEL=tiny-vlm SEQ=64 IMAGES=1 PX=32 STEPS=4 RECOMPUTE=none) the
# whole pipeline runs without a GPU: its baseline is fp32 and its FP8 an emulation, so its
# speedups mean nothing.
#   contrib/bench/fp8_gpu.sh
set -u
cd "$(dirname "$0")/../.."
out=${OUT:-build/gpu-out}
MODEL=${MODEL:-qwen2.5-vl-3b}
SEQ=${SEQ:-4096}
IMAGES=${IMAGES:-4}
PX=${PX:-448}
STEPS=${STEPS:-50}
RECOMPUTE=${RECOMPUTE:-full}
SEED=${SEED:-1}
DEVICE=${DEVICE:-cuda}
train=${HEARTH_TRAIN:-build/bin/hearth-train}
hearth=${HEARTH:-build/bin/hearth}
mkdir -p "$out"
out=$(cd "$out" && pwd)   # the policy path in the run configs must not depend on the cwd
status=0

# The shape of every step below: train_gpu.sh's vlm rows.
SHAPE=(--set model="$MODEL" --set device="$DEVICE" --set train.seq_len="$SEQ"
       --set train.global_batch=1 --set train.micro_batch=1 --set train.recompute="$RECOMPUTE"
       --set train.seed="$SEED" --set data.images_min="$IMAGES" --set data.images_max="$IMAGES"
       --set data.image_px_min="$PX" --set data.image_px_max="$PX")
db=$out/fp8-results/hearth.db
H=("$hearth" --db "$db" --runs-dir "$out/fp8-results/runs")

# bench: step 1, the layer benchmark, timed.
bench() {
    rm -rf "$out/fp8-bench" "$out/fp8-bench.seconds"
    local t0 t1
    t0=$(date +%s.%N)
    "$train" --bench-layers "${SHAPE[@]}" --out "$out/fp8-bench" \
        >"$out/fp8-bench.out" 2>"$out/fp8-bench.err"
    local rc=$?
    t1=$(date +%s.%N)
    if [ "$rc" != 0 ]; then
        echo "layer bench FAILED (exit $rc): see $out/fp8-bench.err"
        tail -3 "$out/fp8-bench.err"
        return 1
    fi
    awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f\n", b - a }' >"$out/fp8-bench.seconds"
}

# resolve: step 2; writes $out/fp8-auto.keys (the resolved keys, one a line) and prints the
# orchestrator's evidence.
resolve() {
    rm -rf "$out/fp8-results" "$out/fp8-auto.keys" "$out/fp8-auto-policy.yaml"
    mkdir -p "$out/fp8-results"
    "${H[@]}" bench ingest "$out/fp8-bench/layer_bench.json" \
        >"$out/fp8-ingest.out" 2>"$out/fp8-ingest.err" ||
        { echo "hearth bench ingest FAILED:"; cat "$out/fp8-ingest.err"; return 1; }
    cat "$out/fp8-ingest.out"
    # fp8: auto, as a sweep would resolve it: one point of this shape.
    cat >"$out/fp8-auto-spec.yaml" <<EOF
name: fp8-auto
base:
  model: "$MODEL"
  device: $DEVICE
  train: {seq_len: $SEQ, micro_batch: 1, global_batch: 1, steps: $STEPS, measure_from: 2,
          recompute: $RECOMPUTE, seed: $SEED}
  data: {images_min: $IMAGES, images_max: $IMAGES, image_px_min: $PX, image_px_max: $PX}
  precision: {fp8: auto}
EOF
    "${H[@]}" plan "$out/fp8-auto-spec.yaml" >"$out/fp8-plan.out" 2>"$out/fp8-plan.err" ||
        { echo "hearth plan FAILED:"; cat "$out/fp8-plan.err"; return 1; }
    echo "precision.fp8: auto, resolved by \`hearth plan\` ($out/fp8-plan.out):"
    sed -n '/^auto values/,/^estimated GPU-hours/p' "$out/fp8-plan.out" | sed '1d;$d;/^$/d'
    local line
    line=$(grep -m1 -o 'precision\.fp8=[a-z]*.*' "$out/fp8-plan.out")
    case $line in
    precision.fp8=selective*)
        # the policy file the plan named (it writes none): `select fp8` at the same counts
        "${H[@]}" select fp8 --model "$MODEL" --seq "$SEQ" "${SHAPE[@]:2}" \
            --out "$out/fp8-auto-policy.yaml" >"$out/fp8-select.out" 2>"$out/fp8-select.err" ||
            { echo "hearth select fp8 FAILED:"; cat "$out/fp8-select.err"; return 1; }
        local want got
        want=$(sed -n 's/.*(policy .*fp8-\([0-9a-f]*\)\.yaml).*/\1/p' <<<"$line")
        got=$(sha256sum "$out/fp8-auto-policy.yaml" | cut -c1-16)
        # the plan names its policy by the text's sha256: the same text, the same policy
        # (a path too long for the plan's line shows no name: nothing to compare)
        [ -z "$want" ] || [ "$want" = "$got" ] ||
            { echo "the policy of \`select fp8\` ($got) is not the plan's ($want)"; return 1; }
        grep -E '^(token counts|[0-9]+ rules?:|policy written)' "$out/fp8-select.out"
        printf 'precision.fp8=selective\nprecision.fp8_policy=%s\n' \
            "$out/fp8-auto-policy.yaml" >"$out/fp8-auto.keys" ;;
    precision.fp8=off*)
        echo "precision.fp8=off" >"$out/fp8-auto.keys" ;;
    *)
        echo "no precision.fp8 in the plan's output: see $out/fp8-plan.out"; return 1 ;;
    esac
}

# run NAME KEY=VALUE...: step 3, one training.
run() {
    local name=$1 sets=() kv
    shift
    for kv in "$@"; do sets+=(--set "$kv"); done
    "$train" "${SHAPE[@]}" --set train.steps="$STEPS" --set train.measure_from=2 "${sets[@]}" \
        --out "$out/fp8-$name" --force >"$out/fp8-$name.out" 2>"$out/fp8-$name.err" || {
        echo "$name: FAILED: see $out/fp8-$name.err"
        grep 'hearth-train: ' "$out/fp8-$name.err" | tail -2
        return 1
    }
}

if [ "${TABLE_ONLY:-0}" = 0 ]; then
    echo "hearth-train device=$DEVICE: $MODEL, sequence $SEQ, $IMAGES images of ${PX}px," \
         "recompute $RECOMPUTE, seed $SEED, $STEPS steps"
    # hearth-train's own rules, before any time is spent
    if ! "$train" --plan-memory "${SHAPE[@]}" --set precision.fp8=all \
            >"$out/fp8-plan-memory.out" 2>&1; then
        echo "warning: hearth-train refuses precision.fp8=all at this shape:"
        grep 'hearth-train: ' "$out/fp8-plan-memory.out" | sed 's/^/  /'
        echo "  (auto resolves to off and the run \`all\` fails)"
    fi
    rm -rf "$out"/fp8-{bf16,auto,all} "$out"/fp8-{bf16,auto,all}.{out,err}
    if bench; then
        echo "layer bench: $(cat "$out/fp8-bench.seconds") s for every linear kind of $MODEL" \
             "($(grep -m1 -o '([0-9]* rows)' "$out/fp8-bench.out" | tr -d '()'))"
        resolve || status=1
    else
        status=1
    fi
    run bf16 precision.fp8=off || status=1
    if [ -s "$out/fp8-auto.keys" ]; then
        mapfile -t keys <"$out/fp8-auto.keys"
        run auto "${keys[@]}" || status=1
    else
        echo "auto: not run (fp8: auto was not resolved)"
        status=1
    fi
    run all precision.fp8=all || status=1
fi

echo
bench_s=$(cat "$out/fp8-bench.seconds" 2>/dev/null || echo "")
echo "fp8: auto -> $(paste -sd' ' "$out/fp8-auto.keys" 2>/dev/null || echo "(not resolved)")"
python3 - "$out" "$DEVICE" "$MODEL" "$SEQ" "$IMAGES" "$PX" "$STEPS" "$bench_s" <<'EOF'
import json, os, sys

out, device, model, seq, images, px, steps, bench_s = sys.argv[1:]


def load(name):
    """(ms, tok/s, loss, GiB, steps) or (None, why)."""
    d = f"{out}/fp8-{name}"
    try:
        err = [l.strip() for l in open(f"{d}.err") if "hearth-train: " in l][-1:]
    except OSError:
        err = []
    try:
        r = json.load(open(f"{d}/result.json"))
        m = [json.loads(l) for l in open(f"{d}/metrics.jsonl")]
        done = r.get("exit_status") == "done" and r.get("step_ms_median") is not None and m
    except (OSError, ValueError):
        done = False
    if not done:
        if any("out of memory" in l.lower() for l in err):
            return None, "OOM"
        if not err and not os.path.exists(f"{d}.err"):
            return None, "not run"
        return None, "FAILED" + (f": {err[-1].split('hearth-train: ', 1)[1]}" if err else "")
    return (r["step_ms_median"], r["tokens_per_s"], m[-1]["loss"], r["peak_mem_bytes"] / 2**30,
            m[-1]["step"]), None


def policy(name):
    if name == "bf16":
        return "off"
    if name == "all":
        return "all"
    try:
        keys = dict(l.strip().split("=", 1) for l in open(f"{out}/fp8-auto.keys") if "=" in l)
    except OSError:
        return "unresolved"
    if keys.get("precision.fp8") != "selective":
        return "off (auto)"
    try:
        pol = open(keys["precision.fp8_policy"]).read()
        n = pol.count("{component:")
    except OSError:
        n = "?"
    return f"selective, {n} rule{'' if n == 1 else 's'}"


rows = [(name, policy(name), *load(name)) for name in ("bf16", "auto", "all")]
base = rows[0][2]
print(f"{'run':5s} {'policy':22s} {'ms/step':>9s} {'tokens/s':>9s} {'speedup':>8s} "
      f"{'loss':>9s} {'loss vs bf16':>12s} {'peak GiB':>8s}")
for name, pol, v, why in rows:
    if v is None:
        print(f"{name:5s} {pol:22s} {why}")
        continue
    ms, tok, loss, gib, last = v
    sp = f"{base[0] / ms:.2f}x" if base else "-"
    dl = f"{100 * (loss - base[2]) / base[2]:+.2f}%" if base else "-"
    print(f"{name:5s} {pol:22s} {ms:9.1f} {tok:9.0f} {sp:>8s} {loss:9.4f} {dl:>12s} {gib:8.2f}")

print(f"{model}, sequence {seq}, {images} x {px}px, device {device}; loss after step "
      f"{steps}; speedup: bf16's ms/step over the run's")
if bench_s:
    ok = "met" if float(bench_s) < 120 else "not met"
    print(f"target: layer bench under 120 s for the whole model: {ok} ({bench_s} s)")
auto = rows[1][2]
if base and auto:
    sp, dl = base[0] / auto[0], 100 * (auto[2] - base[2]) / base[2]
    print(f"target: auto >= 1.25x bf16's step: {'met' if sp >= 1.25 else 'not met'} ({sp:.2f}x)")
    print(f"target: auto's loss within 1% of bf16's after {steps} steps: "
          f"{'met' if abs(dl) <= 1 else 'not met'} ({dl:+.2f}%)")
else:
    print("targets: not judged (bf16 or auto did not complete)")
if device == "cpu":
    print("device cpu: the baseline computes in fp32 and FP8 is an emulation (quantise-dequantise "
          "around the fp32 GEMM): CPU-measured speedups mean nothing")
EOF
[ $? = 0 ] || status=1
exit "$status"
