#!/usr/bin/env bash
# Long sequences on the CPU reference path, side by side: one hearth-train run per memory
# option on the same config and seed (the losses agree up to fp32 reordering): the median
# step time, the process's peak resident memory, the memory plan's prediction for the
# process (result.json memory.predicted_process_bytes, docs/memory.md) and the final loss.
# cp 2 runs two thread ranks in this one process, so its memory is both ranks'.
# usage: contrib/bench/long_seq.sh [BUILD_DIR] [extra --set KEY=VALUE ...]
set -u
build=${1:-build}
shift || true
tmp=$(mktemp -d "${TMPDIR:-/tmp}/hearth-bench-longseq.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
ARGS=(--set model=tiny-vlm --set train.steps=8 --set train.measure_from=3
      --set train.seq_len=2048 --set train.micro_batch=1 --set train.global_batch=1
      --set data.images_min=2 --set data.images_max=2 --set data.image_px_min=128
      --set data.image_px_max=128 "$@")
# name | overrides
CASES=("baseline|"
       "chunks 2|--set parallel.chunks=2"
       "chunks 4|--set parallel.chunks=4"
       "chunks 4 + full|--set parallel.chunks=4 --set train.recompute=full"
       "full recompute|--set train.recompute=full"
       "cp 2 (2 ranks)|--set ranks=2 --set parallel.cp=2")
field() { sed -n "s/.*\"$2\": *\([^,}]*\).*/\1/p" "$1/result.json" | head -1; }
mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
printf '%-18s %14s %16s %20s %22s\n' option "step ms (p50)" "peak RSS (MiB)" \
    "predicted (MiB)" "final loss"
i=0
for c in "${CASES[@]}"; do
    name=${c%%|*}
    read -r -a extra <<<"${c#*|}"
    dir="$tmp/run$i"
    i=$((i + 1))
    if ! "$build/bin/hearth-train" "${ARGS[@]}" "${extra[@]}" --out "$dir" >"$dir.log" 2>&1; then
        echo "$name: hearth-train failed"; tail -3 "$dir.log"; exit 1
    fi
    printf '%-18s %14.1f %16s %20s %22s\n' "$name" "$(field "$dir" step_ms_median)" \
        "$(mib "$(field "$dir" peak_mem_bytes)")" \
        "$(mib "$(field "$dir" predicted_process_bytes)")" "$(field "$dir" final_loss)"
done
