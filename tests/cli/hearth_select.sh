#!/usr/bin/env bash
# Selection end to end: `hearth bench ingest` (idempotent, malformed files named),
# `hearth select fp8` (policy file, decision recorded, no rule -> bf16), `hearth bench
# layers` (says so when the trainer cannot benchmark), `hearth select encoder` (the measured
# best first, the rest predicted, the sweep to measure them), and `auto` values in a spec
# resolved by `hearth plan` with their evidence and GPU-hours, and by `hearth submit`
# with the decisions recorded.
set -u
cd "$(dirname "$0")/../.."
. tests/cli/lib.sh
. tests/cli/hearth_common.bash
hearth_tmp select

tap_plan 11

# Random speedups around the threshold for two kinds (fresh every run).
seed=${HEARTH_TEST_SEED:-$RANDOM}
echo "# seed $seed (set HEARTH_TEST_SEED to repeat)"
RANDOM=$seed
fast=$((130 + RANDOM % 60))    # fc1: 1.30x .. 1.89x
slow=$((70 + RANDOM % 30))     # qkv: 0.70x .. 0.99x
cat >lb.json <<EOF
{"gpu": "NVIDIA H200", "cuda": "12.6", "cublaslt": "120603", "model": "qwen2.5-vl-3b",
 "rows": [
  {"component": "decoder", "kind": "fc1", "tp": 1, "tokens": 1024, "bf16_ms": $fast, "fp8_ms": 100, "repeats": 10},
  {"component": "decoder", "kind": "fc1", "tp": 1, "tokens": 8192, "bf16_ms": $fast, "fp8_ms": 100, "repeats": 10},
  {"component": "decoder", "kind": "qkv", "tp": 1, "tokens": 1024, "bf16_ms": $slow, "fp8_ms": 100, "repeats": 10},
  {"component": "decoder", "kind": "qkv", "tp": 1, "tokens": 8192, "bf16_ms": $slow, "fp8_ms": 100, "repeats": 10},
  {"component": "decoder", "kind": "lm_head", "tp": 1, "tokens": 1024, "bf16_ms": 300, "fp8_ms": 100, "repeats": 10},
  {"component": "decoder", "kind": "lm_head", "tp": 1, "tokens": 8192, "bf16_ms": 300, "fp8_ms": 100, "repeats": 10}
 ]}
EOF

run_h ing1 bench ingest lb.json
run_h ing2 bench ingest lb.json
ingest_ok() {
    rc_is ing1 0 && rc_is ing2 0 || return 1
    grep -q "already recorded" ing2.out || { cat ing2.out; return 1; }
    [ "$(sql "select count(*) from layer_bench")" = 6 ] || { echo "want 6 rows"; return 1; }
}
tap_check "bench ingest: 6 rows, the same file twice recorded once" ingest_ok

sed 's/"kind": "qkv", "tp": 1, "tokens": 8192/"kind": "gemm", "tp": 1, "tokens": 8192/' lb.json >bad.json
run_h bad bench ingest bad.json
bad_ok() {
    rc_is bad 2 && grep -q 'bad.json: rows\[3\].kind: expected one of' bad.err &&
        [ "$(sql "select count(*) from layer_bench")" = 6 ]
}
tap_check "bench ingest: a malformed row is named (exit 2), nothing recorded" bad_ok

tok=$((2000 + RANDOM % 4000))
run_h fp8 select fp8 --model qwen2.5-vl-3b --seq $tok --out policy.yaml
fp8_ok() {
    rc_is fp8 0 || return 1
    grep -q '^  - {component: decoder, kind: fc1, tp: 1, min_tokens: 1024, max_tokens: 8192' policy.yaml &&
        ! grep -q 'kind: qkv' policy.yaml && ! grep -q 'kind: lm_head' policy.yaml &&
        grep -q '^keep_bf16: \[lm_head, router, decoder.layers.first, decoder.layers.last\]' policy.yaml &&
        grep -q '^gpu: "NVIDIA H200"' policy.yaml ||
        { cat policy.yaml; return 1; }
    [ "$(sql "select count(*) from decisions where kind = 'fp8' and method = 'measured'")" = 1 ]
}
tap_check "select fp8: fc1 in FP8 ($fast/100 at $tok tokens), qkv and lm_head bf16, decision recorded" fp8_ok

run_h fp8b select fp8 --model qwen2.5-vl-3b --seq $tok --threshold 2 --allow lm_head --out p2.yaml
fp8b_ok() {
    rc_is fp8b 0 && grep -q '^  - {component: decoder, kind: lm_head' p2.yaml &&
        ! grep -q 'kind: fc1' p2.yaml && grep -q '^keep_bf16: \[router, ' p2.yaml || { cat p2.yaml; return 1; }
}
tap_check "select fp8 --threshold 2 --allow lm_head: only the LM head (3x) earns FP8" fp8b_ok

run_h fp8c select fp8 --model qwen2.5-vl-3b --seq 20000 --out p3.yaml
tap_check "select fp8 beyond the measured tokens: no rule, every linear bf16" \
    bash -c "[ \$(cat fp8c.rc) = 0 ] && grep -q '^rules: \[\]' p3.yaml && grep -q 'every linear stays bf16' fp8c.out"

run_h fp8d select fp8 --model qwen2.5-vl-7b --seq 1024 --out p4.yaml
tap_check "select fp8 without benchmarks of the model: exit 2, says how to get them" \
    bash -c "[ \$(cat fp8d.rc) = 2 ] && grep -q 'bench ingest' fp8d.err && [ ! -e p4.yaml ]"

# A trainer without the mode (an older build): said so, nothing left behind.
printf '#!/bin/sh\necho "usage: hearth-train --config FILE --out DIR"\n' >old-trainer.sh
chmod +x old-trainer.sh
run_h bl bench layers --model tiny-vlm --trainer "$T/old-trainer.sh"
tap_check "bench layers: exit 2 when the trainer has no --bench-layers mode" \
    bash -c "[ \$(cat bl.rc) = 2 ] && grep -q 'no --bench-layers mode' bl.err && [ ! -d runs/bench-layers/tiny-vlm-* ]"

# Two measured encoder layouts of tiny-vlm on 2 CPU ranks (tp 2); throughputs set by hand
# so that hetero_dp is the measured best.
cat >enc.yaml <<EOF
name: enc
$TINY_BASE
  ranks: 2
  parallel: {tp: 2}
matrix:
  parallel.encoder.strategy: [uniform, hetero_dp]
repeat: 2
EOF
run_h sub submit enc.yaml --backend local --jobs 2
hdp=$((5000000 + RANDOM))
sql "update results set tokens_per_s = $hdp + run % 3 where run in (select r.id from runs r where r.config_json like '%\"strategy\":\"hetero_dp\"%')"
sql "update results set tokens_per_s = 1000 where run in (select r.id from runs r where r.config_json like '%\"strategy\":\"uniform\"%')"
run_h enc select encoder --model tiny-vlm --gpus 2 --device cpu --seq 32 --layout tp=2
enc_ok() {
    rc_is sub 0 && rc_is enc 0 || return 1
    head -3 enc.out | tail -1 | grep -q '^ *1  hetero_dp .* measured  *2 ' || { cat enc.out; return 1; }
    grep -q 'uniform .* measured  *2 ' enc.out && grep -q 'full_separation .* predicted  *0 ' enc.out &&
        grep -q '2 of 5 candidates measured' enc.out || { cat enc.out; return 1; }
}
tap_check "select encoder: measured hetero_dp first, uniform measured, the rest predicted" enc_ok
sweep_ok() {
    sed -n '/^name: encoder-tiny-vlm-2r/,$p' enc.out >sweep.yaml
    "$HEARTH_ABS" --db "$T/none.db" plan sweep.yaml >sweep.plan 2>&1 || { cat sweep.plan; return 1; }
    grep -q '3 kept' sweep.plan || { cat sweep.plan; return 1; }
}
tap_check "select encoder: the printed sweep plans the 3 unmeasured layouts" sweep_ok

cat >auto.yaml <<EOF
name: auto
$TINY_BASE
  ranks: 2
  parallel: {tp: 2, encoder: {strategy: auto}}
  precision: {fp8: auto}
EOF
run_h plan plan auto.yaml
plan_ok() {
    rc_is plan 0 || return 1
    grep -q 'parallel.encoder.strategy=hetero_dp (encoder tp 1, offload false): measured' plan.out &&
        grep -q 'precision.fp8=off: no layer benchmarks of model tiny-vlm' plan.out &&
        grep -q 'estimated GPU-hours of the kept runs: .*1 point from prior runs of the same config' plan.out ||
        { cat plan.out; return 1; }
}
tap_check "plan: auto resolves to the measured best, fp8 off with the reason, GPU-hours from prior runs" plan_ok

run_h asub submit auto.yaml --backend local
asub_ok() {
    rc_is asub 0 || return 1
    [ "$(sql "select count(*) from runs r join experiments e on e.id = r.experiment_id where e.name = 'auto' and r.config_json like '%\"strategy\":\"hetero_dp\"%' and r.state = 'completed'")" = 1 ] ||
        { sql "select run_id, state, config_hash from runs"; return 1; }
    [ "$(sql "select group_concat(kind || ':' || method, ',') from (select kind, method from decisions where experiment = 'auto' order by kind)")" = "encoder:measured,fp8:none" ] ||
        { sql "select * from decisions"; return 1; }
    [ "$(sql "select count(*) from decisions where experiment = 'auto' and config_hash = (select config_hash from runs where run_id = 'auto-1')")" = 2 ] ||
        { cat asub.out asub.err; sql "select kind, config_hash from decisions"; sql "select run_id, config_hash from runs"; return 1; }
}
tap_check "submit: the auto point runs as hetero_dp, both decisions recorded with its hash" asub_ok
