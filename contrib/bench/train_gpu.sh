#!/usr/bin/env bash
# contrib/bench/train_gpu.sh - hearth-train on one GPU (device: cuda) side by side with
# PyTorch and transformers, in one run, one table:
#   vlm 4096   the Qwen2.5-VL-3B shape: sequence 4096 holding 4 images of 448x448;
#   vlm 2048   the same model, sequence 2048 holding 2 images of 448x448;
#   text 4096  the same model, sequence 4096, no images (the encoder does not run);
#              each against contrib/bench/vlm_transformers.py (transformers'
#              Qwen2_5_VLForConditionalGeneration at the same dims: fp32 weights, bf16
#              autocast, SDPA, fused AdamW) without and with liger-kernel's Triton kernels;
#              the baseline of a row is the faster of the two that ran; hearth runs at
#              bf16 compute with train.recompute=RECOMPUTE for every row where it is set,
#              else the least recomputation that fits an 80 GB GPU (its activations are
#              fp32): full for vlm 4096, selective for vlm 2048 and text 4096 (an H100
#              measured 76.2 and 69.9 GiB there, and selective out of memory at vlm 4096);
#   gpt2       GPT-2 124M, B 64 x T 1024 (micro batches of MICRO sequences), at
#              precision.compute bf16 (the cuda default) and fp32, against
#              contrib/bench/gpt2_torch.py (torch.compile, bf16 autocast, fused AdamW).
# Columns: ms/step (median of the measured steps), tokens/s (tokens over the measured steps'
# time), MFU (hearth's analytic FLOPs per token, result.json's flops_per_token, the Python
# sides compute the same formula, x tokens/s over PEAK TFLOP/s: default 989, the dense bf16
# peak of the H100 SXM and of the H200), peak GiB (hearth: its device allocations; PyTorch:
# torch.cuda.max_memory_allocated), encoder (share of the step in the vision tower's
# forward + backward: hearth's encoder_ms / step_ms), loss first->last. A side that runs out
# of memory shows OOM; "vs base" is hearth's tokens/s over the baseline's, and the lines after
# the table say which sides each row compared and the largest VLM shape both fit.
# Logs and run directories go to $OUT (or build/gpu-out).  Needs build/bin/hearth-train and
# build/lib/libhearth_cuda.so; python3 with torch and transformers (liger-kernel optional).
# TABLE_ONLY=1 runs nothing and prints the table of the runs already in $OUT; ROWS="gpt2
# vlm2048" runs those rows only (the table shows every row whose logs are in $OUT).
#   contrib/bench/train_gpu.sh
set -u
cd "$(dirname "$0")/../.."
out=${OUT:-build/gpu-out}
mkdir -p "$out"
PEAK=${PEAK:-989}
MICRO=${MICRO:-16}
STEPS=${STEPS:-6}
RECOMPUTE=${RECOMPUTE:-}
train=${HEARTH_TRAIN:-build/bin/hearth-train}
status=0

# $out persists between runs of this script: each run's directories replace the last's.
# GPT-2 124M: hearth (activations stored in fp32 in this version) and torch.compile.
GPT2=(--set model=gpt2-124m --set device=cuda --set train.seq_len=1024
      --set train.global_batch=64 --set train.micro_batch="$MICRO" --set train.measure_from=2
      --set train.lr=6e-4)
gpt2() {
    "$train" "${GPT2[@]}" --set train.steps="$STEPS" --out "$out/gpt2" --force \
        >"$out/gpt2.out" 2>"$out/gpt2.err" || status=1
    "$train" "${GPT2[@]}" --set train.steps=3 --set precision.compute=fp32 --out "$out/gpt2-fp32" \
        --force >"$out/gpt2-fp32.out" 2>"$out/gpt2-fp32.err" || status=1
    python3 contrib/bench/gpt2_torch.py --batch 64 --micro "$MICRO" --seq 1024 \
        --steps "$STEPS" --peak "$PEAK" >"$out/gpt2_torch.log" 2>&1 || status=1
}

# hearth's train.recompute for row NAME (the header above).
recompute_of() {
    if [ -n "$RECOMPUTE" ]; then echo "$RECOMPUTE"; return; fi
    case $1 in vlm4096) echo full ;; *) echo selective ;; esac
}

# vlm NAME SEQ IMAGES: the Qwen2.5-VL-3B shape, hearth, transformers and transformers+liger.
vlm() {
    local name=$1 seq=$2 images=$3
    "$train" --set model=qwen2.5-vl-3b --set device=cuda --set train.seq_len="$seq" \
        --set train.global_batch=1 --set train.micro_batch=1 --set train.steps=3 \
        --set train.measure_from=2 --set train.recompute="$(recompute_of "$name")" \
        --set data.images_min="$images" --set data.images_max="$images" \
        --set data.image_px_min=448 --set data.image_px_max=448 --out "$out/$name" --force \
        >"$out/$name.out" 2>"$out/$name.err" || status=1
    # OOM is a result (exit 0); a crash is not.
    python3 contrib/bench/vlm_transformers.py --seq "$seq" --images "$images" --px 448 \
        --warmup 2 --steps 3 --peak "$PEAK" >"$out/$name-hf.log" 2>&1 || status=1
    # liger-kernel is optional: its absence or a version that does not load shows in the table.
    python3 contrib/bench/vlm_transformers.py --seq "$seq" --images "$images" --px 448 \
        --warmup 2 --steps 3 --peak "$PEAK" --liger >"$out/$name-liger.log" 2>&1
}
if [ "${TABLE_ONLY:-0}" = 0 ]; then
    for row in ${ROWS:-gpt2 vlm4096 vlm2048 text4096}; do
        case $row in
        gpt2) gpt2 ;;
        vlm4096) vlm vlm4096 4096 4 ;;
        vlm2048) vlm vlm2048 2048 2 ;;
        text4096) vlm text4096 4096 0 ;;
        *) echo "ROWS: unknown row '$row' (gpt2 vlm4096 vlm2048 text4096)" >&2; exit 2 ;;
        esac
    done
fi

gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
echo "hearth-train device=cuda, one GPU (${gpu:-no nvidia-smi});" \
     "MFU over $PEAK TFLOP/s (dense bf16 peak); hearth's Qwen rows: recompute" \
     "vlm4096 $(recompute_of vlm4096), vlm2048 $(recompute_of vlm2048)," \
     "text4096 $(recompute_of text4096)"
# The table: a row is a shape, its lines the sides: hearth DIR (the side compared; further
# hearth lines are shown only), result LOG (vlm_transformers.py; a baseline candidate),
# torch LOG (gpt2_torch.py; the baseline).
python3 - "$PEAK" \
    "row|VLM S 4096, 4 x 448px" "hearth|hearth|$out/vlm4096" \
        "result|transformers|$out/vlm4096-hf.log" "result|transformers+liger|$out/vlm4096-liger.log" \
    "row|VLM S 2048, 2 x 448px" "hearth|hearth|$out/vlm2048" \
        "result|transformers|$out/vlm2048-hf.log" "result|transformers+liger|$out/vlm2048-liger.log" \
    "row|text S 4096, no images" "hearth|hearth|$out/text4096" \
        "result|transformers|$out/text4096-hf.log" "result|transformers+liger|$out/text4096-liger.log" \
    "row|GPT-2 124M, B 64 x T 1024" "hearth|hearth bf16|$out/gpt2" "hearth|hearth fp32|$out/gpt2-fp32" \
        "torch|torch.compile|$out/gpt2_torch.log" <<'EOF'
import json, sys

peak = float(sys.argv[1])
rows = []
for arg in sys.argv[2:]:
    kind, label, *rest = arg.split("|")
    if kind == "row":
        rows.append((label, []))
    else:
        rows[-1][1].append((kind, label, rest[0]))


def hearth(d):
    """(ms, tok/s, mfu, GiB, encoder %, loss) or (None, why)."""
    try:
        err = [l.strip() for l in open(f"{d}.err") if "hearth-train: " in l][-1:]
    except OSError:
        return None, "not run"
    try:
        r = json.load(open(f"{d}/result.json"))
        m = [json.loads(l) for l in open(f"{d}/metrics.jsonl")]
        done = r.get("exit_status") == "done" and r.get("step_ms_median") is not None
    except (OSError, ValueError):
        done = False
    if not done:
        if any("out of memory" in l.lower() for l in err):
            return None, "OOM"
        return None, f"failed (see {d}.err)"
    enc = sorted(x["encoder_ms"] / x["step_ms"] for x in m[1:]) or [0]
    mfu = r["flops_per_token"] * r["tokens_per_s"] / (peak * 1e12) * 100
    return (r["step_ms_median"], r["tokens_per_s"], mfu, r["peak_mem_bytes"] / 2**30,
            100 * enc[len(enc) // 2], f"{m[0]['loss']:.4f}->{m[-1]['loss']:.4f}"), None


def result(log, torch_fmt):
    """The RESULT line of vlm_transformers.py (or gpt2_torch.py's older one)."""
    try:
        lines = [l.split() for l in open(log)]
    except FileNotFoundError:
        return None, "not run"
    except OSError as e:
        return None, f"failed ({e.strerror}: {log})"
    res = [l for l in lines if l and l[0] == "RESULT"]
    if not res:
        return None, f"failed (no RESULT: see {log})"
    f = res[-1]
    if torch_fmt:   # RESULT torch tok/s ms mfu GiB loss0 loss1
        return (float(f[3]), float(f[2]), float(f[4]), float(f[5]), None, f"{f[6]}->{f[7]}"), None
    if f[2] in ("OOM", "no-liger", "failed"):
        why = {"OOM": "OOM", "no-liger": "liger-kernel not installed",
               "failed": f"failed (see {log})"}[f[2]]
        return None, why
    return (float(f[2]), float(f[3]), float(f[4]), float(f[5]), float(f[6]), "-"), None


def num(v, fmt):
    return "-" if v is None else format(v, fmt)


print(f"{'':26s} {'':20s} {'ms/step':>9s} {'tokens/s':>9s} {'MFU %':>6s} {'peak GiB':>8s} "
      f"{'encoder':>8s} {'vs base':>8s}  loss first->last")
notes, both = [], []
for shape, sides in rows:
    got = []
    for kind, label, path in sides:
        v, why = hearth(path) if kind == "hearth" else result(path, kind == "torch")
        got.append((kind, label, v, why))
    first_hearth = next((g for g in got if g[0] == "hearth"), None)
    cands = [g for g in got if g[0] in ("result", "torch") and g[2]]
    base = max(cands, key=lambda g: g[2][1]) if cands else None
    for i, (kind, label, v, why) in enumerate(got):
        head = shape if i == 0 else ""
        if v is None:
            print(f"{head:26s} {label:20s} {why}")
            continue
        ms, tok, mfu, gib, enc, loss = v
        ratio = "base" if base and base[1] == label else (
            f"{tok / base[2][1]:.2f}x" if base and kind == "hearth" else "")
        print(f"{head:26s} {label:20s} {ms:9.1f} {tok:9.0f} {mfu:6.2f} {gib:8.2f} "
              f"{num(enc, '7.1f') + ('%' if enc is not None else ''):>8s} {ratio:>8s}  {loss}")
    h = first_hearth
    if h and h[2] and base:
        notes.append(f"{shape}: {h[1]} vs {base[1]} (the faster of the baselines that ran): "
                     f"{h[2][1] / base[2][1]:.2f}x the baseline's tokens/s")
        if shape.startswith("VLM"):
            both.append(shape)
    else:
        miss = [g[1] + ": " + g[3] for g in got if g[2] is None]
        notes.append(f"{shape}: not compared ({'; '.join(miss) or 'no baseline'})")
print("compared:")
for n in notes:
    print("  " + n)
print("largest VLM shape both fit: " + (both[0] if both else "none"))
EOF
for f in gpt2 gpt2-fp32 vlm4096 vlm2048 text4096; do
    grep -q 'hearth-train: ' "$out/$f.err" 2>/dev/null &&
        { echo "$f:"; grep 'hearth-train: ' "$out/$f.err" | tail -2; }
done
for f in vlm4096 vlm2048 text4096; do
    for s in hf liger; do
        grep -h '^# .*\(out of memory\|failed\|not installed\)' "$out/$f-$s.log" 2>/dev/null |
            sed "s|^# |$f-$s: |"
    done
done
exit "$status"
