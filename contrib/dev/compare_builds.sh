#!/usr/bin/env bash
# contrib/dev/compare_builds.sh OLD NEW - the per-step losses and gradient norms of two
# hearth-train builds, bit for bit, over a set of configs that covers the model's paths
# (encoder, MoE, learned positions, tp x pp, cp, dp x ep, sequence chunks, fp8, a frozen
# encoder).  For refactors that must not change the CPU path's arithmetic: prints one line
# per config (same / DIFF / failed) and exits 1 when any differs.
#   git worktree add /tmp/old HEAD~1 && make -C /tmp/old build/bin/hearth-train
#   contrib/dev/compare_builds.sh /tmp/old/build/bin/hearth-train build/bin/hearth-train
set -u
[ $# -eq 2 ] || { echo "usage: $0 OLD_HEARTH_TRAIN NEW_HEARTH_TRAIN" >&2; exit 2; }
old=$1 new=$2
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d "${TMPDIR:-/tmp}/hearth-compare.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
status=0

# the step, loss and grad_norm fields of every metrics.jsonl line, as written
columns() { sed 's/^{\("step":[^,]*\),\("loss":[^,]*\),\("grad_norm":[^,]*\),.*/\1 \2 \3/' "$1"; }

compare() {   # compare NAME ARGS...
    local name=$1; shift
    "$old" "$@" --out "$tmp/$name.old" >/dev/null 2>&1 || { echo "failed $name (old)"; status=1; return; }
    "$new" "$@" --out "$tmp/$name.new" >/dev/null 2>&1 || { echo "failed $name (new)"; status=1; return; }
    if cmp -s <(columns "$tmp/$name.old/metrics.jsonl") <(columns "$tmp/$name.new/metrics.jsonl"); then
        echo "same  $name"
    else
        echo "DIFF  $name"
        status=1
    fi
}

VLM=(--config contrib/examples/tiny-vlm-cpu.yaml)
MOE=(--config contrib/examples/tiny-vlm-moe-cpu.yaml)
compare vlm "${VLM[@]}" --set train.steps=4
compare moe "${MOE[@]}" --set train.steps=4
compare gpt2 --set model=gpt2-124m --set model.decoder.layers=2 --set train.seq_len=64 \
    --set train.steps=3 --set train.global_batch=2 --set train.micro_batch=1
compare tp2pp2 "${VLM[@]}" --set train.steps=3 --set ranks=4 --set parallel.tp=2 \
    --set parallel.pp=2 --set parallel.encoder.strategy=hetero_dp --set parallel.encoder.tp=1
compare cp2 "${VLM[@]}" --set train.steps=3 --set ranks=2 --set parallel.cp=2
compare dp4ep2 "${MOE[@]}" --set train.steps=3 --set ranks=4 --set parallel.dp=4 \
    --set parallel.ep=2 --set train.global_batch=8
compare chunks2 "${VLM[@]}" --set train.steps=3 --set parallel.chunks=2
compare fp8 "${VLM[@]}" --set train.steps=3 --set precision.fp8=all
compare frozen --config contrib/examples/tiny-vlm-frozen-encoder.yaml --set train.steps=3
exit $status
