#!/usr/bin/env bash
# contrib/bench/fp8_gpu.sh end to end on the CPU with tiny-vlm: the layer bench, its ingest
# into a scratch database, `precision.fp8: auto` resolved by the plan, three trainings and
# the table (bf16, auto, all; the policy line; the targets; the cpu caveat).  Then with the
# bench's FP8 times halved (a trainer wrapper), so that auto selects a policy: the plan's
# policy and the file `select fp8 --set` writes are the same text, and auto trains with it.
# Then RECOMPUTE=full: FP8 trains with activation recomputation, the three rows with
# numbers and no refusal said.  TABLE_ONLY=1 prints the table again.
set -u
cd "$(dirname "$0")/../.."
. tests/cli/lib.sh
. tests/cli/hearth_common.bash
hearth_tmp fp8_bench

tap_plan 5

SCRIPT="$ROOT/contrib/bench/fp8_gpu.sh"
bench() {   # bench NAME [VAR=VALUE...]: the script on the cpu, output in NAME.log, status in NAME.rc
    local name=$1; shift
    env OUT="$T/$name" DEVICE=cpu MODEL=tiny-vlm SEQ=64 IMAGES=1 PX=32 STEPS=4 RECOMPUTE=none \
        HEARTH_TRAIN="$TRAIN_ABS" HEARTH="$HEARTH_ABS" "$@" "$SCRIPT" >"$name.log" 2>&1
    echo $? >"$name.rc"
}
# row LOG RUN POLICY: the table's row of RUN, with numbers
row() {
    grep -Eq "^$2 +$3 +[0-9.]+ +[0-9]+ +[0-9.]+x +[0-9.]+ +[-+][0-9.]+% +[0-9.]+$" "$1"
}

bench plain
plain_ok() {
    [ "$(cat plain.rc)" = 0 ] || { cat plain.log; return 1; }
    grep -q '^layer bench: [0-9.]* s for every linear kind of tiny-vlm (44 rows)' plain.log &&
        grep -q 'precision.fp8: auto, resolved by `hearth plan`' plain.log &&
        grep -Eq '^    precision\.fp8=(off|selective): ' plain.log &&
        grep -Eq '^ +decoder +fc1 +1 +[0-9.]+ +0\.0[0-9]+ ' plain.log &&
        grep -Eq '^fp8: auto -> precision\.fp8=(off|selective precision\.fp8_policy=.*/fp8-auto-policy\.yaml)$' plain.log &&
        row plain.log bf16 off && row plain.log auto '(off \(auto\)|selective, [0-9]+ rules?)' &&
        row plain.log all all &&
        grep -Eq '^target: auto >= 1\.25x bf16.s step: (met|not met) \([0-9.]+x\)$' plain.log &&
        grep -Eq '^target: auto.s loss within 1% of bf16.s after 4 steps: (met|not met) \([-+][0-9.]+%\)$' plain.log &&
        grep -q '^target: layer bench under 120 s for the whole model: met' plain.log &&
        grep -q 'CPU-measured speedups mean nothing' plain.log || { cat plain.log; return 1; }
}
tap_check "fp8_gpu.sh on the cpu: bench, auto with its evidence, three rows, targets, the cpu caveat" plain_ok

# A trainer whose layer bench reports FP8 twice as fast: auto earns a policy.
cat >fast.sh <<EOF
#!/bin/bash
"$TRAIN_ABS" "\$@" || exit
for a; do [ "\$a" = --bench-layers ] && fast=1; done
[ -n "\${fast:-}" ] || exit 0
while [ \$# -gt 1 ] && [ "\$1" != --out ]; do shift; done
jq '.rows |= map(.fp8_ms = .bf16_ms / 2)' "\$2/layer_bench.json" >"\$2/lb.tmp" &&
    mv "\$2/lb.tmp" "\$2/layer_bench.json"
EOF
chmod +x fast.sh
bench fast HEARTH_TRAIN="$T/fast.sh"
fast_ok() {
    [ "$(cat fast.rc)" = 0 ] || { cat fast.log; return 1; }
    grep -q '^    precision.fp8=selective: 10 rules from layer benchmarks on cpu at 64 tokens (policy .*/fp8-[0-9a-f]\{16\}\.yaml)' fast.log &&
        grep -q "^token counts of one rank's micro batch: decoder 64, encoder 16, projector 4" fast.log &&
        grep -q "^fp8: auto -> precision.fp8=selective precision.fp8_policy=$T/fast/fp8-auto-policy.yaml$" fast.log &&
        row fast.log auto 'selective, 10 rules' || { cat fast.log; return 1; }
    grep -q 'kind: qkv, tp: 1, min_tokens: 4, max_tokens: 32' fast/fp8-auto-policy.yaml &&
        grep -q 'selective is emulated' fast/fp8-auto/train.log &&
        ! grep -q 'matches no linear' fast/fp8-auto/train.log || { cat fast/fp8-auto/train.log; return 1; }
}
tap_check "auto earns a policy: the plan's policy is the file written, per-component token counts, auto trains with it" fast_ok

bench full HEARTH_TRAIN="$T/fast.sh" RECOMPUTE=full STEPS=2
full_ok() {
    [ "$(cat full.rc)" = 0 ] || { echo "exit $(cat full.rc), want 0"; cat full.log; return 1; }
    ! grep -q 'refuses\|would break rule\|FAILED' full.log &&
        grep -q 'recompute full' full.log &&
        grep -q "^fp8: auto -> precision.fp8=selective precision.fp8_policy=$T/full/fp8-auto-policy.yaml$" full.log &&
        row full.log bf16 off && row full.log auto 'selective, 10 rules' &&
        row full.log all all || { cat full.log; return 1; }
    jq -e '.train.recompute == "full" and .precision.fp8 == "all"' full/fp8-all/config.json \
        >/dev/null && grep -q 'is emulated' full/fp8-all/train.log ||
        { echo "fp8-all: not FP8 with train.recompute=full"; cat full/fp8-all/config.json \
              full/fp8-all/train.log; return 1; }
}
tap_check "RECOMPUTE=full: FP8 trains with recomputation, auto selective and all with numbers, exit 0" full_ok

table_only_ok() {
    env OUT="$T/fast" DEVICE=cpu MODEL=tiny-vlm SEQ=64 IMAGES=1 PX=32 STEPS=4 TABLE_ONLY=1 \
        HEARTH_TRAIN=/nonexistent HEARTH=/nonexistent "$SCRIPT" >again.log 2>&1 ||
        { cat again.log; return 1; }
    # the table and the lines after it, as the run printed them
    diff <(sed -n '/^fp8: auto -> /,$p' fast.log) <(sed -n '/^fp8: auto -> /,$p' again.log)
}
tap_check "TABLE_ONLY=1 runs nothing and prints the same table" table_only_ok

missing_ok() {
    env OUT="$T/none" DEVICE=cpu TABLE_ONLY=1 "$SCRIPT" >none.log 2>&1
    [ $? = 0 ] && grep -q '^fp8: auto -> (not resolved)' none.log &&
        grep -Eq '^bf16 +off +not run$' none.log && grep -q '^targets: not judged' none.log ||
        { cat none.log; return 1; }
}
tap_check "TABLE_ONLY=1 without runs: every row says not run" missing_ok
