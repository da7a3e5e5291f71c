#!/usr/bin/env bash
# hearth plan asks the spec's trainer what it can run (hearth-train --capabilities): a
# device: cuda point whose trainer lacks the cuda backend is pruned by rule
# trainer_has_cuda, naming the trainer; the built trainer answers with the devices of its
# build; a trainer that cannot answer (an older build) prunes nothing on that account.
set -u
cd "$(dirname "$0")/../.."
. tests/cli/lib.sh
HEARTH_ABS=$(realpath "$HEARTH")
TRAIN_ABS=$(realpath "$HEARTH_TRAIN")

tmp=$(mktemp -d "${TMPDIR:-/tmp}/hearth-cli-caps.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"

# spec NAME TRAINER: device cpu and cuda points of tiny-vlm
spec() {
    cat >"$1.yaml" <<EOS
name: $1
trainer: $2
base:
  model: tiny-vlm
  train: {steps: 2}
matrix:
  device: [cpu, cuda]
EOS
}
printf '#!/bin/sh\n[ "$1" = --capabilities ] && { echo '"'"'{"devices": ["cpu"]}'"'"'; exit 0; }\nexit 1\n' >cpu-only.sh
printf '#!/bin/sh\nexit 2\n' >old.sh
chmod +x cpu-only.sh old.sh

tap_plan 4

out=$("$TRAIN_ABS" --capabilities 2>&1)
want='{"devices": ["cpu"'
[ -e "$(dirname "$TRAIN_ABS")/../lib/libhearth_cuda.so" ] && want='{"devices": ["cpu", "cuda"]}'
tap_result "$(case $out in "$want"*) echo 0 ;; *) echo 1 ;; esac)" \
    "hearth-train --capabilities lists the devices of its build" "got '$out', want '$want...'"

spec nocuda "$tmp/cpu-only.sh"
"$HEARTH_ABS" --db "$tmp/h.db" plan nocuda.yaml >nocuda.out 2>&1
rc=$?
tap_result "$([ $rc = 0 ] && grep -q 'trainer_has_cuda  cuda' nocuda.out &&
              grep -q "the trainer $tmp/cpu-only.sh was built without the cuda backend" nocuda.out &&
              grep -q '1 kept (1 runs), 1 pruned' nocuda.out; echo $?)" \
    "a trainer without cuda: the cuda point pruned by rule trainer_has_cuda, naming it" \
    "exit $rc; $(cat nocuda.out)"

spec old "$tmp/old.sh"
"$HEARTH_ABS" --db "$tmp/h.db" plan old.yaml >old.out 2>&1
tap_result "$(grep -q '2 kept' old.out && ! grep -q trainer_has_cuda old.out; echo $?)" \
    "a trainer that cannot answer --capabilities prunes nothing on its account" "$(cat old.out)"

spec built "$TRAIN_ABS"
"$HEARTH_ABS" --db "$tmp/h.db" plan built.yaml >built.out 2>&1
if [ -e "$(dirname "$TRAIN_ABS")/../lib/libhearth_cuda.so" ]; then
    ok=$(grep -q '2 kept' built.out && ! grep -q trainer_has_cuda built.out; echo $?)
else
    ok=$(grep -q trainer_has_cuda built.out; echo $?)
fi
tap_result "$ok" "the built trainer: cuda points kept exactly when its build has the backend" \
    "$(cat built.out)"
