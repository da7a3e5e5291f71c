#!/usr/bin/env bash
# hearth-train --init-from / --export-hf with the small transformers-made Qwen2.5-VL of
# tests/data/hf-qwen2.5-vl-tiny: a checkpoint goes in and out unchanged (f32 and bf16, one
# rank and a tp 2 x pp 2 layout), it really replaces the initial parameters, and a
# checkpoint of another shape, a missing one or bad option combinations are refused
# (exit 2, message naming the key, nothing written).  config.json comes back as it was
# read (only its dtype follows the export); a key that changes the model is refused with
# its value and rule, an unknown one is named in a warning.
set -u
cd "$(dirname "$0")/../.."
. tests/cli/lib.sh

tmp=$(mktemp -d "${TMPDIR:-/tmp}/hearth-cli-hf.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
FIX=tests/data/hf-qwen2.5-vl-tiny
# lr 0: the one step leaves the parameters as they were loaded
BASE=(--set "model=$FIX/model.yaml" --set train.steps=1 --set train.lr=0
      --set train.seq_len=64 --set data.image_px_min=16 --set data.image_px_max=24)
LAYOUT=(--set ranks=4 --set parallel.tp=2 --set parallel.pp=2)

tap_plan 10

# runhf NAME ARGS...: hearth-train with its output in $tmp/NAME.log, exit status in .rc
runhf() {
    local name=$1; shift
    "$HEARTH_TRAIN" "$@" --out "$tmp/$name" >"$tmp/$name.log" 2>&1
    echo $? >"$tmp/$name.rc"
}
rc_is() { [ "$(cat "$tmp/$1.rc")" = "$2" ] || { echo "exit $(cat "$tmp/$1.rc"), want $2"; cat "$tmp/$1.log"; return 1; }; }
first_loss() { sed -n 's/.*"loss":\([^,]*\),.*/\1/p' "$tmp/$1/metrics.jsonl" | head -1; }

runhf one "${BASE[@]}" --init-from "$FIX" --export-hf "$tmp/e1"
runhf layout "${BASE[@]}" "${LAYOUT[@]}" --init-from "$tmp/e1" --export-hf "$tmp/e2"
roundtrip() {
    rc_is one 0 && rc_is layout 0 &&
        [ -f "$tmp/e1/config.json" ] && [ -f "$tmp/e1/model.safetensors" ] &&
        cmp "$tmp/e1/model.safetensors" "$tmp/e2/model.safetensors" &&
        cmp "$tmp/e1/config.json" "$tmp/e2/config.json"
}
tap_check "f32 export, re-imported by tp 2 x pp 2 and exported again: identical files" roundtrip

runhf bf16 "${BASE[@]}" --init-from "$FIX" --export-hf "$tmp/b1" --export-dtype bf16
runhf back "${BASE[@]}" --init-from "$tmp/b1" --export-hf "$tmp/b2"
bf16() {
    rc_is bf16 0 && rc_is back 0 &&
        grep -q '"dtype": "bfloat16"' "$tmp/b1/config.json" &&
        [ "$(stat -c %s "$tmp/b1/model.safetensors")" -lt "$(stat -c %s "$tmp/e1/model.safetensors")" ] &&
        cmp "$tmp/b2/model.safetensors" "$tmp/e1/model.safetensors"
}
tap_check "bf16 export of bf16-exact weights loads back to the same f32 checkpoint" bf16

runhf fresh "${BASE[@]}"
replaces() {
    rc_is fresh 0 && local a b && a=$(first_loss one) && b=$(first_loss fresh) &&
        [ -n "$a" ] && [ "$a" != "$b" ] && grep -q "initialised from" "$tmp/one/train.log" &&
        [ "$(first_loss layout)" != "" ]
}
tap_check "--init-from replaces the initial parameters (step-1 loss differs from a fresh init)" replaces

runhf other --set model=tiny-vlm --set train.steps=1 --init-from "$FIX"
mismatch() {
    rc_is other 2 && grep -q "hidden_size is 64, the run's model.decoder.hidden is 256" \
        "$tmp/other.log" && [ ! -e "$tmp/other" ]
}
tap_check "a checkpoint of another shape: exit 2 naming both keys, no run directory" mismatch

runhf missing "${BASE[@]}" --init-from "$tmp/no-such-dir"
missing() { rc_is missing 2 && grep -q "no-such-dir/config.json" "$tmp/missing.log"; }
tap_check "a missing checkpoint: exit 2 naming config.json" missing

runhf dtype "${BASE[@]}" --export-dtype bf16
runhf dtype2 "${BASE[@]}" --export-hf "$tmp/x" --export-dtype fp8
options() {
    rc_is dtype 2 && grep -q "needs --export-hf" "$tmp/dtype.log" &&
        rc_is dtype2 2 && grep -q "expected f32 or bf16" "$tmp/dtype2.log"
}
tap_check "--export-dtype without --export-hf, a bad dtype: exit 2" options

mkdir -p "$tmp/torn"
cp "$FIX/config.json" "$tmp/torn/"
head -c 1000 "$FIX/model.safetensors" >"$tmp/torn/model.safetensors"
runhf torn "${BASE[@]}" --init-from "$tmp/torn"
torn() { rc_is torn 2 && grep -q "torn/model.safetensors" "$tmp/torn.log"; }
tap_check "a truncated safetensors file: refused, naming the file" torn

asread() {
    sed 's/"dtype": "bfloat16"/"dtype": "float32"/' "$FIX/config.json" >"$tmp/want.json" &&
        cmp "$tmp/want.json" "$tmp/e1/config.json" &&
        cmp "$FIX/config.json" "$tmp/b1/config.json" &&
        grep -q '"tokens_per_second": 4,' "$tmp/e1/config.json"
}
tap_check "config.json exported as read (only dtype set to the export's)" asread

# variant NAME SED-SCRIPT: the fixture with its config.json edited
variant() {
    mkdir -p "$tmp/$1" && sed "$2" "$FIX/config.json" >"$tmp/$1/config.json" &&
        ln -s "$PWD/$FIX/model.safetensors" "$tmp/$1/model.safetensors"
}
variant linear 's/"rope_type": "default"/"rope_type": "linear"/'
runhf rlinear "${BASE[@]}" --init-from "$tmp/linear"
variant sliding 's/"use_sliding_window": false/"use_sliding_window": true/; s/"sliding_window": null/"sliding_window": 8/; s/"max_window_layers": 80/"max_window_layers": 0/'
runhf rsliding "${BASE[@]}" --init-from "$tmp/sliding"
refused() {
    rc_is rlinear 2 && rc_is rsliding 2 &&
        grep -q 'text_config.rope_parameters.rope_type: "linear" is not supported: ' "$tmp/rlinear.log" &&
        grep -q 'text_config.use_sliding_window: true is not supported: with sliding_window 8' "$tmp/rsliding.log" &&
        [ ! -f "$tmp/rlinear/metrics.jsonl" ] && [ ! -f "$tmp/rsliding/metrics.jsonl" ]
}
tap_check "a key that changes the model (rope type linear, sliding window): exit 2 naming key, value and rule" refused

variant unknown 's/"image_token_id": 300,/"image_token_id": 300,\n  "hearth_test_key": 1,/'
runhf runknown "${BASE[@]}" --init-from "$tmp/unknown" --export-hf "$tmp/u1"
unknown() {
    rc_is runknown 0 && grep -q 'warning: .*keys hearth does not know were ignored.*: hearth_test_key$' "$tmp/runknown/train.log" &&
        grep -q '"hearth_test_key": 1,' "$tmp/u1/config.json"
}
tap_check "an unknown key: accepted with a warning naming it, kept on export" unknown
