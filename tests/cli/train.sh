#!/usr/bin/env bash
# hearth-train end to end: a good tiny run and its outputs, every class of bad config
# (exit 2, message, no run directory created), a run directory holding an earlier run's
# results (refused and left as it was, unless --force), divergence (exit 3), runtime
# failure (exit 1), --help and --version.
set -u
cd "$(dirname "$0")/../.."
. tests/cli/lib.sh

tmp=$(mktemp -d "${TMPDIR:-/tmp}/hearth-cli-train.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# A tiny run: short sequences and small images, so a step takes milliseconds.
cat >"$tmp/good.yaml" <<'EOF'
model: tiny-vlm
train:
  steps: 5
  seq_len: 32
  micro_batch: 2
  global_batch: 4
  lr: 1.0e-3
  warmup: 2
  measure_from: 2
data:
  images_min: 1
  images_max: 2
  image_px_min: 16
  image_px_max: 32
EOF
TINY=(--set train.seq_len=32 --set train.micro_batch=2 --set train.global_batch=4
      --set data.images_min=1 --set data.images_max=2 --set data.image_px_min=16
      --set data.image_px_max=32)

METRIC_KEYS="step loss grad_norm lr step_ms tokens tokens_per_s encoder_ms decoder_ms peak_mem_bytes"
RESULT_KEYS="config_hash steps step_ms_median step_ms_p10 step_ms_p90 tokens_per_s
tokens_per_s_per_gpu flops_per_token mfu peak_mem_bytes final_loss exit_status device
device_count nodes versions"

# run NAME ARGS...: runs hearth-train, keeping stdout, stderr and the exit status.
run() {
    local name=$1; shift
    "$HEARTH_TRAIN" "$@" >"$tmp/$name.out" 2>"$tmp/$name.err"
    echo $? >"$tmp/$name.rc"
}
rc_of() { cat "$tmp/$1.rc"; }

# expect_rc NAME CODE
expect_rc() {
    local got; got=$(rc_of "$1")
    [ "$got" = "$2" ] || { echo "exit status $got, want $2"; cat "$tmp/$1.err"; return 1; }
}

# metrics_ok FILE N: N lines, each a JSON object with every key, steps 1..N in order.
metrics_ok() {
    local f=$1 n=$2 i=0 line k
    [ -f "$f" ] || { echo "no $f"; return 1; }
    [ "$(wc -l <"$f")" -eq "$n" ] || { echo "$(wc -l <"$f") lines, want $n"; return 1; }
    while IFS= read -r line; do
        i=$((i + 1))
        case $line in "{"*"}") ;; *) echo "line $i is not an object: $line"; return 1 ;; esac
        for k in $METRIC_KEYS; do
            grep -q "\"$k\":" <<<"$line" || { echo "line $i lacks $k: $line"; return 1; }
        done
        [ "$(grep -o '"[a-z_]*":' <<<"$line" | wc -l)" -eq 10 ] || { echo "line $i: not exactly 10 keys: $line"; return 1; }
        grep -q "^{\"step\":$i," <<<"$line" || { echo "line $i: step is not $i: $line"; return 1; }
    done <"$f"
}

# result_ok FILE STATUS: every key, and the exit status.
result_ok() {
    local f=$1 k
    [ -f "$f" ] || { echo "no $f"; return 1; }
    for k in $RESULT_KEYS; do
        grep -q "^  \"$k\":" "$f" || { echo "result.json lacks $k"; cat "$f"; return 1; }
    done
    grep -q "\"exit_status\": \"$2\"" "$f" || { echo "exit_status is not $2"; cat "$f"; return 1; }
    grep -q '"config_hash": "[0-9a-f]\{64\}"' "$f" || { echo "bad config_hash"; cat "$f"; return 1; }
    grep -q '"mfu": null' "$f" || { echo "mfu is not null on cpu"; return 1; }
    grep -q '"cuda": null' "$f" || { echo "versions.cuda is not null"; return 1; }
}

good_run() {
    expect_rc good 0 || return 1
    metrics_ok "$tmp/good-out/metrics.jsonl" 5 || return 1
    result_ok "$tmp/good-out/result.json" done || return 1
    grep -q '"steps": 5,' "$tmp/good-out/result.json" || { echo "steps is not 5"; return 1; }
    [ -s "$tmp/good-out/config.json" ] || { echo "no config.json"; return 1; }
    # config.json is the canonical JSON whose sha256 is the config hash
    local h; h=$(sha256sum <"$tmp/good-out/config.json" | cut -c1-64)
    grep -q "\"config_hash\": \"$h\"" "$tmp/good-out/result.json" || { echo "config hash is not sha256(config.json) $h"; return 1; }
    grep -q "^step 5/5 loss " "$tmp/good-out/train.log" || { echo "no progress in train.log"; return 1; }
    grep -q "^step 5/5 loss " "$tmp/good.err" || { echo "no progress on stderr"; return 1; }
    [ ! -e "$tmp/good-out/.result.json.tmp" ] || { echo "temp file left"; return 1; }
}

# The same run again gives bitwise the same losses (metrics carry 17 digits).
same_losses() {
    expect_rc good2 0 || return 1
    diff <(grep -o '"loss":[^,]*' "$tmp/good-out/metrics.jsonl") \
         <(grep -o '"loss":[^,]*' "$tmp/good2-out/metrics.jsonl")
}

# no_dir NAME: the run directory was not created.
no_dir() {
    local d=$tmp/$1-out
    [ ! -e "$d" ] || { echo "$d was created, holding: $(ls -A "$d")"; return 1; }
}

# bad_config NAME PATTERN: exit 2, PATTERN (grep -E) on stderr, nothing written.
bad_config() {
    expect_rc "$1" 2 || return 1
    grep -Eq -- "$2" "$tmp/$1.err" || { echo "stderr lacks /$2/:"; cat "$tmp/$1.err"; return 1; }
    no_dir "$1"
}

# snapshot DIR: every file under DIR with its sha256, to see that nothing changed.
snapshot() { (cd "$1" && find . -type f -print0 | sort -z | xargs -0 sha256sum); }

tap_plan 31

run good --config "$tmp/good.yaml" --out "$tmp/good-out"
tap_check "good run: exit 0, metrics.jsonl (5 lines, all keys), result.json (all keys), logs" good_run
run good2 --config "$tmp/good.yaml" --out "$tmp/good2-out"
tap_check "same config twice: bitwise-identical losses" same_losses

# The same directory again: an earlier run's results are not replaced by accident.  A
# refused run (for the directory, or for its config) leaves every file as it was.
before=$(snapshot "$tmp/good-out")
run again --config "$tmp/good.yaml" --set train.steps=2 --out "$tmp/good-out"
refused_again() {
    expect_rc again 2 || return 1
    grep -q -- "--out $tmp/good-out: holds the results of an earlier run (result.json): --resume $tmp/good-out continues that run, --force replaces its results" "$tmp/again.err" ||
        { cat "$tmp/again.err"; return 1; }
    [ "$(snapshot "$tmp/good-out")" = "$before" ] || { echo "the earlier run's files changed"; return 1; }
}
tap_check "--out holding an earlier run's results: exit 2, names --resume and --force, changes nothing" refused_again
run againbad --config "$tmp/good.yaml" --set train.stepz=2 --force --out "$tmp/good-out"
refused_config() {
    expect_rc againbad 2 && grep -q "train.stepz" "$tmp/againbad.err" &&
        [ "$(snapshot "$tmp/good-out")" = "$before" ] || { echo "the earlier run's files changed"; return 1; }
}
tap_check "a bad config with --force into an earlier run: exit 2, changes nothing" refused_config
# A run that died before its first step leaves nothing to lose: no --force needed.
mkdir -p "$tmp/empty-out"
: >"$tmp/empty-out/metrics.jsonl"
echo "earlier" >"$tmp/empty-out/train.log"
run empty --config "$tmp/good.yaml" --set train.steps=2 --out "$tmp/empty-out"
empty_ok() {
    expect_rc empty 0 && metrics_ok "$tmp/empty-out/metrics.jsonl" 2 &&
        [ "$(head -1 "$tmp/empty-out/train.log")" = earlier ]
}
tap_check "an empty metrics.jsonl is no earlier result: the run goes ahead, train.log appended" empty_ok
# --force: the earlier run's results are replaced, its checkpoints removed.
mkdir -p "$tmp/good-out/checkpoints/step-00000003"
echo step-00000003 >"$tmp/good-out/checkpoints/latest"
run force --config "$tmp/good.yaml" --set train.steps=2 --force --out "$tmp/good-out"
forced() {
    expect_rc force 0 && metrics_ok "$tmp/good-out/metrics.jsonl" 2 &&
        result_ok "$tmp/good-out/result.json" done || return 1
    grep -q '"steps": 2,' "$tmp/good-out/result.json" || { echo "steps is not 2"; return 1; }
    [ ! -e "$tmp/good-out/checkpoints" ] || { echo "the earlier checkpoints are left"; return 1; }
    grep -q "^--force: the results of the earlier run in $tmp/good-out are replaced" "$tmp/good-out/train.log" &&
        grep -q "^step 5/5 loss " "$tmp/good-out/train.log"   # the earlier run's log is kept
}
tap_check "--force: the earlier results replaced (2 steps now), its checkpoints removed, train.log appended" forced

run setonly --set model=tiny-vlm --set train.steps=2 "${TINY[@]}" --out "$tmp/setonly-out/nested"
setonly() { expect_rc setonly 0 && metrics_ok "$tmp/setonly-out/nested/metrics.jsonl" 2 &&
            result_ok "$tmp/setonly-out/nested/result.json" done; }
tap_check "--set only (no --config), nested --out created" setonly

# Unknown key: line 3, column 3 of the file.
printf 'model: tiny-vlm\ntrain:\n  stepz: 3\n' >"$tmp/unknown.yaml"
run unknown --config "$tmp/unknown.yaml" --out "$tmp/unknown-out"
tap_check "unknown key: exit 2, FILE:LINE:COL, nothing written" bad_config unknown "unknown\.yaml:3:3: .*stepz"

printf 'model: tiny-vlm\ntrain:\n  steps: many\n' >"$tmp/type.yaml"
run type --config "$tmp/type.yaml" --out "$tmp/type-out"
tap_check "wrong type: exit 2, names the key, nothing written" bad_config type "type\.yaml:3:[0-9]+: train\.steps"

run shape --config "$tmp/good.yaml" --set model.decoder.kv_heads=3 --out "$tmp/shape-out"
tap_check "impossible shape: exit 2, names the key, nothing written" bad_config shape "kv_heads"

printf 'model: no-such-model\n' >"$tmp/preset.yaml"
run preset --config "$tmp/preset.yaml" --out "$tmp/preset-out"
tap_check "missing preset: exit 2, names it, nothing written" bad_config preset "no-such-model"

# Files that never end or never come: refused by kind before any byte is read (a bounded
# time: the reader once read /dev/zero until memory ran out, and waited on a FIFO forever).
timeout 60 "$HEARTH_TRAIN" --config /dev/zero --out "$tmp/zero-out" >"$tmp/zero.out" 2>"$tmp/zero.err"
echo $? >"$tmp/zero.rc"
tap_check "--config /dev/zero: exit 2, 'not a regular file', nothing written" bad_config zero \
    "/dev/zero: not a regular file \(a character device\)"
printf 'model: /dev/zero\n' >"$tmp/zeromodel.yaml"
timeout 60 "$HEARTH_TRAIN" --config "$tmp/zeromodel.yaml" --out "$tmp/zeromodel-out" \
    >"$tmp/zeromodel.out" 2>"$tmp/zeromodel.err"
echo $? >"$tmp/zeromodel.rc"
tap_check "model: /dev/zero: exit 2, the preset's path named, nothing written" bad_config zeromodel \
    "/dev/zero: not a regular file \(a character device\)"
mkfifo "$tmp/fifo.yaml"
timeout 60 "$HEARTH_TRAIN" --config "$tmp/fifo.yaml" --out "$tmp/fifo-out" >"$tmp/fifo.out" 2>"$tmp/fifo.err"
echo $? >"$tmp/fifo.rc"
tap_check "--config FIFO (no writer): exit 2, 'a FIFO', nothing written" bad_config fifo \
    "fifo\.yaml: not a regular file \(a FIFO\)"
head -c $((16 * 1024 * 1024 + 1)) /dev/zero | tr '\0' '#' >"$tmp/huge.yaml"
run huge --config "$tmp/huge.yaml" --out "$tmp/huge-out"
tap_check "a config over 16 MiB: exit 2, its size and the limit" bad_config huge \
    "huge\.yaml: 16777217 bytes, over the limit of 16 MiB"

run setkey --config "$tmp/good.yaml" --set train.nope=1 --out "$tmp/setkey-out"
tap_check "--set unknown key: exit 2, '--set KEY:', nothing written" bad_config setkey "--set train\.nope"

run setval --config "$tmp/good.yaml" --set train.steps=abc --out "$tmp/setval-out"
tap_check "--set wrong value: exit 2, '--set KEY:', nothing written" bad_config setval "--set train\.steps"

run setsyntax --config "$tmp/good.yaml" --set train.steps --out "$tmp/setsyntax-out"
setsyntax() { expect_rc setsyntax 2 && grep -q -- "--set train.steps: expected KEY=VALUE" "$tmp/setsyntax.err" &&
              [ ! -e "$tmp/setsyntax-out/metrics.jsonl" ] && [ ! -e "$tmp/setsyntax-out/result.json" ]; }
tap_check "--set without '=': exit 2 (usage), no outputs" setsyntax

run noout --config "$tmp/good.yaml"
noout() { expect_rc noout 2 && grep -q -- "--out" "$tmp/noout.err"; }
tap_check "missing --out: exit 2 with a message" noout

# A parallel layout: 4 ranks as threads (tp 2 x pp 2, hetero_dp encoder) train like one.
run parallel --config "$tmp/good.yaml" --set ranks=4 --set parallel.tp=2 --set parallel.pp=2 \
    --set parallel.encoder.strategy=hetero_dp --set parallel.encoder.tp=1 --out "$tmp/parallel-out"
parallel() {
    expect_rc parallel 0 && result_ok "$tmp/parallel-out/result.json" done &&
        grep -q "4 rank(s): tp 2 pp 2" "$tmp/parallel-out/train.log"
}
tap_check "parallel layout (4 ranks, tp 2 x pp 2, hetero_dp): runs to done" parallel

# Context parallelism: 4 ranks as threads (cp 2 x tp 2, sequence parallel).
run cp --config "$tmp/good.yaml" --set ranks=4 --set parallel.cp=2 --set parallel.tp=2 \
    --set parallel.sp=true --out "$tmp/cp-out"
cp_run() {
    expect_rc cp 0 && result_ok "$tmp/cp-out/result.json" done &&
        grep -q "4 rank(s): tp 2 .* sp 1 cp 2," "$tmp/cp-out/train.log"
}
tap_check "context parallel (4 ranks, cp 2 x tp 2, sp): runs to done" cp_run

run cpfullsep --config "$tmp/good.yaml" --set ranks=2 --set parallel.cp=2 \
    --set parallel.encoder.strategy=full_separation --set parallel.encoder.tp=1 \
    --out "$tmp/cpfullsep-out"
tap_check "full_separation with cp 2: exit 2, names the rule, nothing written" bad_config \
    cpfullsep "full_separation_no_cp"

# Sequence chunks: 4 chunks per micro batch through a 2-stage pipeline; the first step
# (before any update) has the unchunked single-rank loss up to fp32 reordering.
run chunks --config "$tmp/good.yaml" --set ranks=2 --set parallel.pp=2 \
    --set parallel.chunks=4 --out "$tmp/chunks-out"
step1_loss() { head -1 "$1" | grep -o '"loss":[^,]*' | cut -d: -f2; }
chunks_run() {
    expect_rc chunks 0 && result_ok "$tmp/chunks-out/result.json" done &&
        metrics_ok "$tmp/chunks-out/metrics.jsonl" 5 || return 1
    local a b
    a=$(step1_loss "$tmp/good2-out/metrics.jsonl")
    b=$(step1_loss "$tmp/chunks-out/metrics.jsonl")
    awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a > 0 && d <= 1e-6 * a) }' ||
        { echo "step 1 loss $b, unchunked $a"; return 1; }
}
tap_check "sequence chunks (4, pp 2): runs to done, step 1 loss = unchunked" chunks_run

run chunkscp --config "$tmp/good.yaml" --set ranks=2 --set parallel.cp=2 \
    --set parallel.chunks=2 --out "$tmp/chunkscp-out"
tap_check "sequence chunks with cp 2: exit 2, names the rule, nothing written" bad_config \
    chunkscp "chunks_no_cp"

run badlayout --config "$tmp/good.yaml" --set ranks=3 --set parallel.tp=3 --out "$tmp/badlayout-out"
tap_check "impossible layout: exit 2, names the rule, nothing written" bad_config badlayout \
    "heads_divisible_by_tp"

# device cuda where it cannot run: a build without the cuda backend (no nvcc) is a config
# error (exit 2); with the backend but no GPU the run fails (exit 1); both say why and
# write nothing.  (Where a GPU answers, tests/gpu/train_gpu.sh trains on it.)
run cuda --config "$tmp/good.yaml" --set device=cuda --out "$tmp/cuda-out"
cuda_refused() {
    if nvidia-smi -L >/dev/null 2>&1; then
        expect_rc cuda 0
    elif [ -e "$BUILD/lib/libhearth_cuda.so" ]; then
        expect_rc cuda 1 || return 1
        grep -q "device cuda: no CUDA device answers" "$tmp/cuda.err" || { cat "$tmp/cuda.err"; return 1; }
        no_dir cuda
    else
        bad_config cuda "device cuda: this build has no CUDA backend"
    fi
}
tap_check "device cuda without a GPU: a clear error, exit 1 (no GPU) or 2 (no backend), nothing written" cuda_refused

# lr and weight decay at their maxima blow the weights up within a few steps.
run diverge --config "$tmp/good.yaml" --set train.steps=30 --set train.lr=1000 \
    --set train.weight_decay=1000 --set train.grad_clip=0 --set train.warmup=0 --out "$tmp/diverge-out"
diverge() {
    expect_rc diverge 3 || return 1
    result_ok "$tmp/diverge-out/result.json" diverged || return 1
    grep -q '"loss":null' "$tmp/diverge-out/metrics.jsonl" || { echo "no null loss in metrics"; return 1; }
    [ "$(wc -l <"$tmp/diverge-out/metrics.jsonl")" -lt 30 ] || { echo "did not stop at once"; return 1; }
    grep -q "diverged" "$tmp/diverge.err"
}
tap_check "NaN loss: exit 3 at once, result.json exit_status diverged" diverge

: >"$tmp/a-file"
run notdir --config "$tmp/good.yaml" --out "$tmp/a-file"
notdir() { expect_rc notdir 1 && grep -q "a-file" "$tmp/notdir.err"; }
tap_check "--out is a file: exit 1 (runtime failure)" notdir

# Every example run config is valid and runs (two steps, short sequences).  Run configs
# are the examples with a top-level `model:`; experiment specs (`name:`, `base:`) are
# the orchestrator's.
examples() {
    local f n=0
    for f in contrib/examples/*.yaml; do
        grep -q '^model:' "$f" || continue
        n=$((n + 1))
        "$HEARTH_TRAIN" --config "$f" --set train.steps=2 --set train.seq_len=48 \
            --set data.image_px_min=16 --set data.image_px_max=32 --set data.images_max=1 \
            --set train.global_batch=2 --set train.micro_batch=2 \
            --out "$tmp/example-$n" >"$tmp/example-$n.log" 2>&1 ||
            { echo "$f: exit $?"; tail -5 "$tmp/example-$n.log"; return 1; }
    done
    [ "$n" -gt 0 ] || { echo "no examples"; return 1; }
}
tap_check "contrib/examples/*.yaml run configs: each runs (2 steps)" examples

run help --help
help() { expect_rc help 0 && grep -q "usage: hearth-train" "$tmp/help.out"; }
tap_check "--help: exit 0, usage on stdout" help

run version --version
version() { expect_rc version 0 && grep -Eq "^hearth-train [0-9]+\.[0-9]+\.[0-9]+" "$tmp/version.out"; }
tap_check "--version: exit 0, prints the version" version
