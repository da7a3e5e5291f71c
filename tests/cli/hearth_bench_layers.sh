#!/usr/bin/env bash
# Layer benchmarks end to end on the CPU: `hearth-train --bench-layers` writes a
# layer_bench.json (every linear kind of tiny-vlm, positive times, a small nonzero FP8
# error, device cpu, build and date); `hearth bench ingest` and `hearth bench layers
# --device cpu` record it with its provenance; `hearth select fp8` from it warns that CPU
# timings say nothing about a GPU; `precision.fp8: auto` prints the evidence.  Then the
# error tolerance (fast but inaccurate -> bf16) and a policy that matches no linear of
# the run (a warning from the plan and from the trainer).  Last, a MoE with a shared expert:
# its linears measured and recorded under their own kinds.
set -u
cd "$(dirname "$0")/../.."
. tests/cli/lib.sh
. tests/cli/hearth_common.bash
hearth_tmp bench_layers

tap_plan 12

SETS=(--set model=tiny-vlm --set train.seq_len=64 --set data.images_min=1
      --set data.images_max=1 --set data.image_px_min=32 --set data.image_px_max=32)
"$TRAIN_ABS" --bench-layers "${SETS[@]}" --out tb >tb.out 2>tb.err
echo $? >tb.rc
file_ok() {
    rc_is tb 0 || return 1
    # every linear kind of tiny-vlm at 4 token counts; times > 0; the FP8 error small
    # but not zero (quantisation happened); provenance
    jq -e '
      .device == "cpu" and .gpu == "cpu" and .model == "tiny-vlm" and
      (.build | length > 0) and (.date | test("^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:]{8}Z$")) and
      ([.rows[] | "\(.component).\(.kind)"] | unique) ==
        ["decoder.fc1", "decoder.fc2", "decoder.lm_head", "decoder.proj", "decoder.qkv",
         "encoder.fc1", "encoder.fc2", "encoder.proj", "encoder.qkv",
         "projector.fc1", "projector.fc2"] and
      (.rows | length) == 44 and
      all(.rows[]; .bf16_ms > 0 and .fp8_ms > 0 and .repeats >= 1 and .tp == 1 and
                   .fp8_err > 0.001 and .fp8_err < 0.1 and
                   .fp8_err == ([.fp8_err_out, .fp8_err_dinp, .fp8_err_dweight] | max)) and
      ([.rows[] | select(.component == "decoder") | .tokens] | unique) == [16, 32, 64, 128]
    ' tb/layer_bench.json >/dev/null || { cat tb.err; head -c 2000 tb/layer_bench.json; return 1; }
    grep -q 'decoder lm_head (tp 1, K 256, N 1024): 4 token counts measured' tb.err &&
        grep -q 'the speedups say nothing about a GPU' tb.out || { cat tb.out tb.err; return 1; }
}
tap_check "hearth-train --bench-layers: every kind of tiny-vlm, times > 0, small FP8 error, device cpu" file_ok

run_h ing bench ingest tb/layer_bench.json
ing_ok() {
    rc_is ing 0 || return 1
    grep -q 'say nothing about a GPU' ing.err || { cat ing.err; return 1; }
    [ "$(sql "select device, build is not null, measured_at like '____-__-__T%' from layer_bench_sets")" = "cpu|1|1" ] ||
        { sql "select * from layer_bench_sets"; return 1; }
    [ "$(sql "select count(*), min(fp8_err) > 0, max(fp8_err) < 0.1 from layer_bench")" = "44|1|1" ] ||
        { sql "select * from layer_bench limit 5"; return 1; }
}
tap_check "bench ingest: the trainer's file recorded with device, build, date and fp8_err" ing_ok

run_h bl bench layers --model tiny-vlm --device cpu --backend local
bl_ok() {
    rc_is bl 0 || return 1
    grep -q 'tiny-vlm on cpu, device cpu, ' bl.out || { cat bl.out; return 1; }
    [ "$(sql "select count(*) from layer_bench_sets where device = 'cpu' and source like '%bench-layers/tiny-vlm-%/layer_bench.json'")" = 1 ] ||
        { sql "select * from layer_bench_sets"; return 1; }
    [ "$(sql "select count(*) from layer_bench where fp8_err is null")" = 0 ]
}
tap_check "bench layers --model tiny-vlm --device cpu: the trainer runs and its file is ingested" bl_ok

# Ctrl-C while the benchmark's job runs: hearth cancels the job (its process group is
# gone), says so, exits non-zero and records nothing.
cat >slowbench.sh <<'EOF2'
#!/bin/bash
case " $* " in *" --help "*) echo "  --bench-layers  time each layer kind"; exit 0 ;; esac
echo $$ >"$SLOW_PID"
exec sleep 60
EOF2
chmod +x slowbench.sh
sets_before=$(sql "select count(*) from layer_bench_sets")
SLOW_PID="$T/slow.pid" "$HEARTH_ABS" --db "$T/h.db" bench layers --model tiny-vlm --device cpu \
    --backend local --trainer "$T/slowbench.sh" >int.out 2>int.err &
hpid=$!
for ((i = 0; i < 500; i++)); do [ -s slow.pid ] && break; sleep 0.02; done
kill -INT $hpid
wait $hpid
echo $? >int.rc
int_ok() {
    ! rc_is int 0 >/dev/null || { echo "exit 0 after the interrupt"; return 1; }
    grep -q 'interrupted: cancelling job' int.err &&
        grep -q 'was cancelled: hearth was interrupted; nothing was recorded' int.err ||
        { cat int.err; return 1; }
    local p; p=$(cat slow.pid 2>/dev/null)
    [ -n "$p" ] && ! kill -0 "$p" 2>/dev/null || { echo "the job's process $p still runs"; return 1; }
    [ "$(sql "select count(*) from layer_bench_sets")" = "$sets_before" ]
}
tap_check "bench layers interrupted (SIGINT): the job is cancelled, nothing is recorded" int_ok

# Every speedup above 0.01: each kind in range of 256 tokens earns FP8 whatever the timing.
run_h sel select fp8 --model tiny-vlm --seq 256 --threshold 0.01 --out pol.yaml
sel_ok() {
    rc_is sel 0 || return 1
    grep -q 'warning: these layer benchmarks ran on the cpu' sel.err || { cat sel.err; return 1; }
    grep -q 'device cpu, build ' sel.out && grep -q ' fp8_err ' sel.out &&
        grep -Eq '^decoder +fc1 +1 +[0-9.]+ +0\.0[0-9]+ .*fp8: speedup >= threshold' sel.out ||
        { cat sel.out; return 1; }
    grep -q '^gpu: "cpu"' pol.yaml && grep -q '^max_err: 0.1' pol.yaml &&
        grep -q 'kind: fc1, tp: 1, .*measured_err: 0.0' pol.yaml || { cat pol.yaml; return 1; }
}
tap_check "select fp8 from the trainer's benchmarks: cpu warning, errors shown, policy with measured_err" sel_ok

# The policy runs: the trainer reads max_err and measured_err.
"$TRAIN_ABS" --set model=tiny-vlm --set train.steps=1 --set precision.fp8=selective \
    --set precision.fp8_policy="$T/pol.yaml" --out run1 >run1.out 2>&1
echo $? >run1.rc
tap_check "the selected policy trains (the trainer reads its evidence keys)" \
    bash -c "[ \$(cat run1.rc) = 0 ] && grep -q 'selective is emulated' run1/train.log && ! grep -q 'matches no linear' run1/train.log"

cat >auto.yaml <<EOF
name: auto
base:
  model: tiny-vlm
  device: cpu
  train: {steps: 1, seq_len: 64, micro_batch: 1, global_batch: 1, warmup: 0}
  data: {images_min: 1, images_max: 1, image_px_min: 32, image_px_max: 32}
  precision: {fp8: auto}
EOF
run_h plan plan auto.yaml
plan_ok() {
    rc_is plan 0 || return 1
    grep -q 'precision.fp8=' plan.out && grep -q 'warning: these layer benchmarks ran on the cpu' plan.out &&
        grep -q 'layer benchmarks: tiny-vlm on cpu (device cpu, build .*, measured 20' plan.out &&
        grep -Eq '^ +encoder +qkv +1 +[0-9.]+ +0\.0[0-9]+ +[0-9]+\.\.[0-9]+ +(bf16|fp8): ' plan.out &&
        grep -Eq '^ +decoder +fc2 +1 +[0-9.]+ +0\.0[0-9]+ +64\.\.64 +(bf16|fp8): ' plan.out || { cat plan.out plan.err; return 1; }
}
tap_check "plan with fp8: auto prints the evidence: the set, each kind's speedup, error, verdict" plan_ok

# Error tolerance: fc1 fast but inaccurate -> bf16; fc2 fast and accurate -> FP8; qkv
# without a measured error -> judged on speed, error unknown; --max-err relaxes it.
err=$(awk -v s="${HEARTH_TEST_SEED:-$RANDOM}" 'BEGIN { srand(s); printf "0.%d%d", 2 + int(rand() * 5), 1 + int(rand() * 9) }')
cat >tol.json <<EOF
{"gpu": "NVIDIA H200", "device": "cuda", "build": "0.1.0", "date": "2026-01-02T03:04:05Z",
 "model": "qwen2.5-vl-3b", "rows": [
  {"component": "decoder", "kind": "fc1", "tp": 1, "tokens": 1024, "bf16_ms": 2, "fp8_ms": 1, "repeats": 5, "fp8_err": $err},
  {"component": "decoder", "kind": "fc1", "tp": 1, "tokens": 8192, "bf16_ms": 2, "fp8_ms": 1, "repeats": 5, "fp8_err": 0.03},
  {"component": "decoder", "kind": "fc2", "tp": 1, "tokens": 1024, "bf16_ms": 2, "fp8_ms": 1, "repeats": 5, "fp8_err": 0.05},
  {"component": "decoder", "kind": "fc2", "tp": 1, "tokens": 8192, "bf16_ms": 2, "fp8_ms": 1, "repeats": 5, "fp8_err": 0.04},
  {"component": "decoder", "kind": "qkv", "tp": 1, "tokens": 1024, "bf16_ms": 2, "fp8_ms": 1, "repeats": 5},
  {"component": "decoder", "kind": "qkv", "tp": 1, "tokens": 8192, "bf16_ms": 2, "fp8_ms": 1, "repeats": 5}
 ]}
EOF
run_h ting bench ingest tol.json
run_h tsel select fp8 --model qwen2.5-vl-3b --seq 4096 --out tol.yaml
run_h tsel2 select fp8 --model qwen2.5-vl-3b --seq 4096 --max-err 0.8 --out tol2.yaml
tol_ok() {
    rc_is ting 0 && rc_is tsel 0 && rc_is tsel2 0 || return 1
    grep -Eq "^decoder +fc1 +1 +2\.000 +$err .*bf16: fp8 error above the tolerance" tsel.out &&
        grep -Eq '^decoder +fc2 +1 +2\.000 +0\.05 .*fp8: speedup >= threshold' tsel.out &&
        grep -Eq '^decoder +qkv +1 +2\.000 +unknown .*fp8: speedup' tsel.out || { cat tsel.out; return 1; }
    ! grep -q 'kind: fc1' tol.yaml && grep -q 'kind: fc2, tp: 1, min_tokens: 1024, max_tokens: 8192' tol.yaml ||
        { cat tol.yaml; return 1; }
    grep -q 'kind: fc1, tp: 1, min_tokens: 1024, max_tokens: 8192' tol2.yaml || { cat tol2.yaml; return 1; }
    ! grep -q 'ran on the cpu' tsel.err
}
tap_check "error tolerance: fc1 ${err} > 0.1 stays bf16 though 2x faster, fc2 FP8, --max-err 0.8 lets fc1 in" tol_ok

# A policy that matches no linear of the run: only tp 2 measured fast, the run has tp 1.
cat >tp2.json <<EOF
{"gpu": "cpu", "device": "cpu", "model": "tiny-vlm", "rows": [
  {"component": "decoder", "kind": "fc1", "tp": 2, "tokens": 16, "bf16_ms": 2, "fp8_ms": 1, "repeats": 5, "fp8_err": 0.05},
  {"component": "decoder", "kind": "fc1", "tp": 2, "tokens": 256, "bf16_ms": 2, "fp8_ms": 1, "repeats": 5, "fp8_err": 0.05}
 ]}
EOF
run_h ting2 bench ingest tp2.json
run_h plan2 plan auto.yaml
nomatch_plan_ok() {
    rc_is ting2 0 && rc_is plan2 0 || return 1
    grep -q 'precision.fp8=off: the 1 rule from layer benchmarks on cpu at 64 tokens match no linear of this point' plan2.out &&
        grep -q 'warning: the selective FP8 policy from the layer benchmarks matches no linear' plan2.out ||
        { cat plan2.out; return 1; }
}
tap_check "plan: a policy whose rules match no linear of the point warns and resolves to off" nomatch_plan_ok

cat >tp2.yaml <<EOF
version: 1
gpu: cpu
model: tiny-vlm
rules:
  - {component: decoder, kind: fc1, tp: 2, min_tokens: 16, max_tokens: 256}
EOF
"$TRAIN_ABS" --set model=tiny-vlm --set train.steps=1 --set precision.fp8=selective \
    --set precision.fp8_policy="$T/tp2.yaml" --out run2 >run2.out 2>&1
echo $? >run2.rc
tap_check "hearth-train warns when its selective policy matches no linear of its model" \
    bash -c "[ \$(cat run2.rc) = 0 ] && grep -q 'warning: precision.fp8_policy .*tp2.yaml matches no linear' run2/train.log && grep -q 'matches no linear' run2.out"

# auto.fp8 in the spec: its threshold and tolerance replace the defaults (here no kind
# of the newest set reaches a 500x speedup); a misspelt key is named with a suggestion;
# --set reaches it too.
{ cat auto.yaml; printf 'auto:\n  fp8: {threshold: 500, max_err: 0.2}\n'; } >auto500.yaml
run_h plan3 plan auto500.yaml
run_h plan4 plan auto.yaml --set auto.fp8.threshold=600
{ cat auto.yaml; printf 'auto:\n  fp8: {treshold: 2}\n'; } >autobad.yaml
run_h plan5 plan autobad.yaml
auto_keys_ok() {
    rc_is plan3 0 && rc_is plan4 0 || { cat plan3.err plan4.err; return 1; }
    grep -q 'precision.fp8=off: no layer kind reaches speedup 500.00 within error 0.2 ' plan3.out &&
        grep -q 'precision.fp8=off: no layer kind reaches speedup 600.00 within error 0.1 ' plan4.out ||
        { cat plan3.out plan4.out; return 1; }
    ! rc_is plan5 0 && grep -q "auto.fp8.treshold.*unknown key (did you mean 'auto.fp8.threshold'?)" plan5.err ||
        { cat plan5.err; return 1; }
}
tap_check "spec auto.fp8.threshold / max_err set fp8: auto's margin and tolerance; a misspelt key is named" auto_keys_ok

# The MoE shared expert (decoder.moe.shared_ffn > 0): its two linears are measured under
# the kinds shared_fc1 / shared_fc2 and recorded (schema 0005 widened the kind check).
"$TRAIN_ABS" --bench-layers --set model=tiny-vlm-moe --set model.decoder.moe.shared_ffn=64 \
    --set train.seq_len=64 --set data.images_min=1 --set data.images_max=1 \
    --set data.image_px_min=32 --set data.image_px_max=32 --out tbs >tbs.out 2>tbs.err
echo $? >tbs.rc
run_h sing bench ingest tbs/layer_bench.json
shared_ok() {
    rc_is tbs 0 && rc_is sing 0 || { cat tbs.err sing.err; return 1; }
    jq -e '[.rows[] | select(.kind | startswith("shared_")) | "\(.component).\(.kind).\(.tokens)"]
           | length == 8 and (map(split(".")[1]) | unique) == ["shared_fc1", "shared_fc2"]
           and all(startswith("decoder."))' tbs/layer_bench.json >/dev/null ||
        { head -c 1500 tbs/layer_bench.json; return 1; }
    grep -q 'decoder shared_fc2 (tp 1, K 64, N 256): 4 token counts measured' tbs.err ||
        { cat tbs.err; return 1; }
    [ "$(sql "select kind, count(*) from layer_bench join layer_bench_sets s on s.id = bench
              where s.model = 'tiny-vlm-moe' and kind like 'shared_%' group by kind
              order by kind" | tr '\n' ' ')" = "shared_fc1|4 shared_fc2|4 " ] ||
        { sql "select component, kind, tokens from layer_bench where kind like 'shared%'"; return 1; }
}
tap_check "bench-layers of a MoE with a shared expert: shared_fc1/fc2 measured and ingested" shared_ok
