#!/usr/bin/env bash
# Activation recomputation on the CPU reference path, side by side: for each of
# train.recompute none / selective / full, one hearth-train run of the same config
# (same seed, so the same losses), and the median step time, the process's peak resident
# memory and the final loss from result.json.
# usage: contrib/bench/recompute.sh [BUILD_DIR] [extra --set KEY=VALUE ...]
set -u
build=${1:-build}
shift || true
tmp=$(mktemp -d "${TMPDIR:-/tmp}/hearth-bench-recompute.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
ARGS=(--set model=tiny-vlm --set train.steps=12 --set train.measure_from=3
      --set train.seq_len=1024 --set train.micro_batch=1 --set train.global_batch=1
      --set data.images_min=2 --set data.images_max=2 --set data.image_px_min=128
      --set data.image_px_max=128 "$@")
field() { sed -n "s/.*\"$2\": *\([^,}]*\).*/\1/p" "$1/result.json" | head -1; }
printf '%-10s %14s %16s %18s\n' recompute "step ms (p50)" "peak RSS (MiB)" "final loss"
for r in none selective full; do
    if ! "$build/bin/hearth-train" "${ARGS[@]}" --set train.recompute=$r --out "$tmp/$r" \
        >"$tmp/$r.log" 2>&1; then
        echo "$r: hearth-train failed"; tail -3 "$tmp/$r.log"; exit 1
    fi
    printf '%-10s %14.1f %16.1f %18s\n' "$r" "$(field "$tmp/$r" step_ms_median)" \
        "$(awk -v b="$(field "$tmp/$r" peak_mem_bytes)" 'BEGIN { print b / 1048576 }')" \
        "$(field "$tmp/$r" final_loss)"
done
