#!/usr/bin/env bash
# contrib/bench/train_gpu.sh - hearth-train on one GPU (device: cuda) side by side with
# PyTorch, in one run, one table:
#   gpt2      GPT-2 124M, B 64 x T 1024 (micro batches of MICRO sequences), at
#             precision.compute bf16 (the cuda default) and fp32, against
#             contrib/bench/gpt2_torch.py (torch.compile, bf16 autocast, fused AdamW);
#   qwen-3b   the Qwen2.5-VL-3B shape (bf16): sequence 4096 holding 4 images of 448x448, one
#             micro batch (hearth only: the transformers baseline is issue-tracked work);
#             the encoder's share of the step from metrics.jsonl's encoder_ms.
# MFU: result.json's flops_per_token x tokens/s over PEAK TFLOP/s (default 989, the H100
# SXM's dense bf16 peak; 989 for the H200 too).  Logs and run directories go to $OUT (or
# build/gpu-out).  Needs build/bin/hearth-train and build/lib/libhearth_cuda.so.
#   contrib/bench/train_gpu.sh
set -u
cd "$(dirname "$0")/../.."
out=${OUT:-build/gpu-out}
mkdir -p "$out"
PEAK=${PEAK:-989}
MICRO=${MICRO:-16}
STEPS=${STEPS:-6}
train=${HEARTH_TRAIN:-build/bin/hearth-train}
status=0

# row NAME DIR: one table row from a run directory
row() {
    python3 - "$1" "$2" "$PEAK" <<'EOF'
import json, sys
name, d, peak = sys.argv[1], sys.argv[2], float(sys.argv[3])
try:
    r = json.load(open(f"{d}/result.json"))
    m = [json.loads(l) for l in open(f"{d}/metrics.jsonl")]
except OSError as e:
    print(f"{name:10s} failed ({e.strerror}: see {d}.err)"); sys.exit(0)
enc = [x["encoder_ms"] / x["step_ms"] for x in m[1:]] or [0]
mfu = r["flops_per_token"] * r["tokens_per_s"] / (peak * 1e12) * 100
print(f"{name:10s} {r['step_ms_median']:10.1f} {r['tokens_per_s']:12.0f} {mfu:7.2f} "
      f"{r['peak_mem_bytes'] / 2**30:9.2f} {100 * sorted(enc)[len(enc) // 2]:8.1f}% "
      f"{m[0]['loss']:8.4f}->{m[-1]['loss']:<8.4f}")
EOF
}

# $out persists between runs of this script: each run's directories replace the last's.
# GPT-2 124M: hearth (activations stored in fp32 in this version) and torch.compile.
GPT2=(--set model=gpt2-124m --set device=cuda --set train.seq_len=1024
      --set train.global_batch=64 --set train.micro_batch="$MICRO" --set train.measure_from=2
      --set train.lr=6e-4)
"$train" "${GPT2[@]}" --set train.steps="$STEPS" --out "$out/gpt2" --force \
    >"$out/gpt2.out" 2>"$out/gpt2.err" || status=1
"$train" "${GPT2[@]}" --set train.steps=3 --set precision.compute=fp32 --out "$out/gpt2-fp32" --force \
    >"$out/gpt2-fp32.out" 2>"$out/gpt2-fp32.err" || status=1
python3 contrib/bench/gpt2_torch.py --batch 64 --micro "$MICRO" --seq 1024 \
    --steps "$STEPS" --peak "$PEAK" >"$out/gpt2_torch.log" 2>&1 || status=1

# The Qwen2.5-VL-3B shape, full recomputation so that fp32 activations fit one card.
"$train" --set model=qwen2.5-vl-3b --set device=cuda --set train.seq_len=4096 \
    --set train.global_batch=1 --set train.micro_batch=1 --set train.steps=3 \
    --set train.measure_from=2 --set train.recompute=full \
    --set data.images_min=4 --set data.images_max=4 \
    --set data.image_px_min=448 --set data.image_px_max=448 --out "$out/qwen3b" --force \
    >"$out/qwen3b.out" 2>"$out/qwen3b.err" || status=1

echo "hearth-train device=cuda, one GPU ($(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)); MFU over $PEAK TFLOP/s"
printf "%-10s %10s %12s %7s %9s %9s %17s\n" "" "ms/step" "tokens/s" "MFU%" "mem GiB" "encoder" \
    "loss first->last"
row gpt2-bf16 "$out/gpt2"
row gpt2-fp32 "$out/gpt2-fp32"
awk '$1 == "RESULT" { printf "%-10s %10.1f %12.0f %7.2f %9.2f %9s %8.4f->%-8.4f\n", "torch", $4, $3, $5, $6, "-", $7, $8 }' \
    "$out/gpt2_torch.log"
row qwen-3b "$out/qwen3b"
for f in gpt2 gpt2-fp32 qwen3b; do
    grep -q 'hearth-train: ' "$out/$f.err" && { echo "$f:"; grep 'hearth-train: ' "$out/$f.err" | tail -2; }
done
exit "$status"
