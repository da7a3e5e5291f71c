#!/usr/bin/env bash
# Signals a user sends: a sweep interrupted with SIGTERM (as Ctrl-C's SIGINT, SIGHUP) after
# its run's first checkpoint leaves that run requeued ("interrupted"), not cancelled, with
# its checkpoint; `hearth resume` continues it from the checkpoint (the real hearth-train:
# train.log says "resumed from ... step N") and completes it, each step recorded once.  A
# run cancelled on purpose (`hearth cancel`) stays cancelled on a plain `hearth resume` and
# is continued from its checkpoint by `hearth resume --include-cancelled`.
set -u
cd "$(dirname "$0")/../.."
. tests/cli/lib.sh
. tests/cli/hearth_common.bash
hearth_tmp interrupt

tap_plan 7

# Enough steps of a small model that the signal lands mid-run, a checkpoint every 10.
STEPS=400
spec() {   # spec NAME
    cat <<EOF
name: $1
trainer: $TRAIN_ABS
base:
  model:
    preset: tiny-vlm
    decoder: {vocab: 128, image_token_id: 127, hidden: 128, ffn: 128, heads: 2}
    encoder: {hidden: 128, ffn: 128, heads: 2, kv_heads: 2}
    projector: {hidden: 128}
  train: {steps: $STEPS, seq_len: 16, micro_batch: 1, global_batch: 2, warmup: 0, measure_from: 1, checkpoint_every: 10}
  data: {images_min: 1, images_max: 1, image_px_min: 16, image_px_max: 16}
matrix:
  train.seed: [7]
EOF
}
steps_once() {   # steps_once RUN_DIR: metrics.jsonl holds steps 1..STEPS, each once
    [ "$(sed -n 's/^{"step":\([0-9]*\),.*/\1/p' "$1/metrics.jsonl" | tr '\n' ' ')" = "$(seq -s ' ' 1 $STEPS) " ]
}
resumed_ok() {   # resumed_ok NAME RUN_DIR
    rc_is "$1" 0 || return 1
    [ "$(sql "select state from runs where run_dir = '$T/$2'")" = completed ] ||
        { sql "select run_id, state from runs"; cat "$1.err"; return 1; }
    grep -q 'resumed from .*/checkpoints/step-[0-9]*: step [1-9][0-9]* of' "$2/train.log" ||
        { echo "train.log:"; cat "$2/train.log"; return 1; }
    steps_once "$2" || { echo "metrics.jsonl does not hold each step once"; return 1; }
}

# ---- SIGTERM to a foreground sweep after the first checkpoint ----
spec intr >i.yaml
"$HEARTH_ABS" --db "$T/h.db" submit i.yaml >int.out 2>int.err &
pid=$!
d=runs/intr/intr-1
wait_for 120 test -f "$d/checkpoints/latest"
kill -TERM "$pid"
wait "$pid"
echo $? >int.rc
interrupted_ok() {
    rc_is int 1 || return 1
    [ "$(sql "select state from runs where run_id = 'intr-1'")" = requeued ] ||
        { sql "select run_id, state from runs"; cat int.err; return 1; }
    [ -f "$d/checkpoints/latest" ] && [ ! -f "$d/result.json" ] || { ls -R "$d"; return 1; }
    grep -q 'intr-1 interrupted after a checkpoint; `hearth resume intr` continues it' int.err || { cat int.err; return 1; }
    grep -q '1 interrupted' int.out && grep -q '`hearth resume intr` continues' int.out || { cat int.out; return 1; }
    flock -n "$d/job.lock" true || { echo "the job still runs"; return 1; }
}
tap_check "SIGTERM after a checkpoint: the run is requeued (interrupted), not cancelled, its checkpoint kept" interrupted_ok
run_h res resume intr
tap_check "resume continues the interrupted run from its checkpoint and completes it" resumed_ok res "$d"
tap_check "the run's history records the interruption" bash -c "
    [ \"\$(sqlite3 -cmd '.timeout 10000' '$T/h.db' \"select count(*) from run_events v join runs r on r.id = v.run where r.run_id = 'intr-1' and v.to_state = 'requeued' and v.note like 'interrupted%'\")\" = 1 ]"

# ---- hearth cancel: stays cancelled unless --include-cancelled ----
spec canc >c.yaml
"$HEARTH_ABS" --db "$T/h.db" submit c.yaml >canc.out 2>canc.err &
pid=$!
d=runs/canc/canc-1
wait_for 120 test -f "$d/checkpoints/latest"
run_h cancel cancel canc-1
wait "$pid"
tap_check "hearth cancel after a checkpoint: cancelled" bash -c "[ \"\$(sqlite3 -cmd '.timeout 10000' '$T/h.db' \"select state from runs where run_id = 'canc-1'\")\" = cancelled ] && [ -f '$T/$d/checkpoints/latest' ]"
run_h plain resume canc
tap_check "plain resume leaves a cancelled run cancelled" bash -c "[ \"\$(sqlite3 -cmd '.timeout 10000' '$T/h.db' \"select state from runs where run_id = 'canc-1'\")\" = cancelled ] && ! grep -q 'resumed from' '$T/$d/train.log'"
run_h incl resume canc --include-cancelled
tap_check "resume --include-cancelled continues the cancelled run from its checkpoint" resumed_ok incl "$d"
tap_check "database integrity" bash -c "[ \"\$(sqlite3 $T/h.db 'pragma integrity_check')\" = ok ]"
