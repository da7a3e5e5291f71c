#!/usr/bin/env bash
# hearth-train checkpoints end to end: SIGTERM mid-run (sent twice) -> checkpoint and exit 75;
# --resume finishes with bitwise the final loss of an uninterrupted run, metrics.jsonl holds
# each step once; SIGUSR2 likewise (without checkpoint_every); SIGHUP likewise, resumed
# from the run directory alone (the checkpoint's own config, no --config); a bad --resume
# exits 2 and leaves the run's files as they were.
set -u
cd "$(dirname "$0")/../.."
. tests/cli/lib.sh

tmp=$(mktemp -d "${TMPDIR:-/tmp}/hearth-cli-ckpt.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# Steps of a few milliseconds: enough of them that the signal lands mid-run.
STEPS=100
seed=${HEARTH_TEST_SEED:-$(( $(date +%s%N) % 100000 ))}
echo "# seed $seed (set HEARTH_TEST_SEED to repeat)"
ARGS=(--set model=tiny-vlm --set train.steps=$STEPS --set train.seq_len=16
      --set train.micro_batch=1 --set train.global_batch=2 --set train.seed="$seed"
      --set data.images_max=1 --set data.image_px_min=16 --set data.image_px_max=16
      --set model.decoder.vocab=128 --set model.decoder.image_token_id=127
      --set model.decoder.hidden=128 --set model.decoder.ffn=128 --set model.decoder.heads=2
      --set model.encoder.hidden=128 --set model.encoder.ffn=128 --set model.encoder.heads=2
      --set model.encoder.kv_heads=2 --set model.projector.hidden=128)

final_loss() { sed -n 's/.*"final_loss": *\([^,]*\),*/\1/p' "$1/result.json"; }
json_steps() { sed -n 's/^{"step":\([0-9]*\),.*/\1/p' "$1/metrics.jsonl" | tr '\n' ' '; }

# run_until_signal DIR SIG N ARGS...: starts a run, sends SIG once metrics.jsonl has N
# lines, waits; the exit status goes to DIR.rc.
run_until_signal() {
    local dir=$1 sig=$2 n=$3; shift 3
    "$HEARTH_TRAIN" "${ARGS[@]}" "$@" --out "$dir" >"$dir.out" 2>"$dir.err" &
    local pid=$! i
    for ((i = 0; i < 3000; i++)); do
        [ -f "$dir/metrics.jsonl" ] && [ "$(wc -l <"$dir/metrics.jsonl")" -ge "$n" ] && break
        sleep 0.02
    done
    # Repeated until the process is gone, as Slurm and impatient users do: later notices
    # land while the checkpoint is written and after the loop has ended; none may kill it.
    kill -"$sig" "$pid"
    while [ -e "/proc/$pid" ] && ! grep -q '^State:[[:space:]]*Z' "/proc/$pid/status" 2>/dev/null; do
        kill -"$sig" "$pid" 2>/dev/null || break
    done
    wait "$pid"
    echo $? >"$dir.rc"
}

tap_plan 12

"$HEARTH_TRAIN" "${ARGS[@]}" --out "$tmp/full" >/dev/null 2>"$tmp/full.err"
tap_result $? "uninterrupted run" "$(tail -3 "$tmp/full.err")"
want=$(final_loss "$tmp/full")

run_until_signal "$tmp/a" TERM 3 --set train.checkpoint_every=5
tap_result "$([ "$(cat "$tmp/a.rc")" = 75 ]; echo $?)" "SIGTERM: exit 75" \
    "exit $(cat "$tmp/a.rc"); $(tail -3 "$tmp/a.err")"
latest=$(cat "$tmp/a/checkpoints/latest" 2>/dev/null)
tap_result "$([ -n "$latest" ] && [ -f "$tmp/a/checkpoints/$latest/manifest.json" ] &&
              [ -f "$tmp/a/checkpoints/$latest/rank-00000.safetensors" ]; echo $?)" \
    "SIGTERM: a complete checkpoint named by latest" "latest '$latest'; $(ls -R "$tmp/a/checkpoints" 2>&1)"
tap_result "$([ ! -f "$tmp/a/result.json" ]; echo $?)" "SIGTERM: no result.json yet"

"$HEARTH_TRAIN" "${ARGS[@]}" --set train.checkpoint_every=5 --out "$tmp/a" \
    --resume "$tmp/a" >/dev/null 2>"$tmp/a2.err"
tap_result $? "resume" "$(tail -3 "$tmp/a2.err")"
got=$(final_loss "$tmp/a")
tap_result "$([ -n "$want" ] && [ "$got" = "$want" ]; echo $?)" \
    "resumed final loss equals the uninterrupted one bitwise" "got '$got', want '$want'"
tap_result "$([ "$(json_steps "$tmp/a")" = "$(seq -s ' ' 1 $STEPS) " ]; echo $?)" \
    "metrics.jsonl: each step once" "steps: $(json_steps "$tmp/a")"

# signal_resume DIR SIG NAME [alone]: SIG (without checkpoint_every: the signal alone
# writes the checkpoint) gives exit 75, and --resume (with the run's arguments, or alone:
# the checkpoint's own config) finishes with the uninterrupted final loss.
signal_resume() {
    local dir=$1 sig=$2 name=$3 rc got args=("${ARGS[@]}")
    [ "${4:-}" = alone ] && args=()
    run_until_signal "$dir" "$sig" 2
    "$HEARTH_TRAIN" ${args[@]+"${args[@]}"} --out "$dir" --resume "$dir" >/dev/null 2>"$dir.resume.err"
    rc=$?
    got=$(final_loss "$dir")
    tap_result "$([ "$(cat "$dir.rc")" = 75 ] && [ $rc = 0 ] && [ "$got" = "$want" ]; echo $?)" \
        "$name: exit 75, resume, same final loss" \
        "first exit $(cat "$dir.rc"), resume exit $rc, loss '$got' want '$want'; $(tail -2 "$dir.resume.err")"
}
signal_resume "$tmp/b" USR2 "SIGUSR2 without checkpoint_every"
# SIGHUP (the terminal went away) likewise, resumed with no config but the checkpoint's.
# Where this shell was started with SIGHUP ignored (nohup), hearth-train keeps it ignored,
# as nohup asks: then the run must go on to its end through the signal.
hup_ignored() {
    local mask; mask=$(awk '/^SigIgn:/ { print $2 }' /proc/$$/status)
    (( (16#$mask & 1) != 0 ))
}
if hup_ignored; then
    run_until_signal "$tmp/h" HUP 2
    tap_result "$([ "$(cat "$tmp/h.rc")" = 0 ] && [ "$(final_loss "$tmp/h")" = "$want" ]; echo $?)" \
        "SIGHUP ignored by the parent (nohup): the run goes on to its end" \
        "exit $(cat "$tmp/h.rc"), loss '$(final_loss "$tmp/h")' want '$want'; $(tail -2 "$tmp/h.err")"
else
    signal_resume "$tmp/h" HUP "SIGHUP, resumed without --config" alone
fi

# snapshot DIR: every file under DIR with its sha256, to see that nothing changed.
snapshot() { (cd "$1" && find . -type f -print0 | sort -z | xargs -0 sha256sum); }

# Another config: refused, exit 2, the message names the key; the run's files (config.json,
# metrics.jsonl, train.log, the checkpoints) are left as they were.
before=$(snapshot "$tmp/b")
"$HEARTH_TRAIN" "${ARGS[@]}" --set train.lr=0.5 --out "$tmp/b" --resume "$tmp/b" \
    >/dev/null 2>"$tmp/c.err"
rc=$?
tap_result "$([ $rc = 2 ] && grep -q "other config: train.lr" "$tmp/c.err" &&
              [ "$(snapshot "$tmp/b")" = "$before" ]; echo $?)" \
    "--resume with another config: exit 2 naming the key, nothing changed" \
    "exit $rc; $(cat "$tmp/c.err"); changed: $(diff <(echo "$before") <(snapshot "$tmp/b"))"
"$HEARTH_TRAIN" --resume "$tmp/b" --out "$tmp/b" --set train.steps=10 >/dev/null 2>"$tmp/d.err"
rc=$?
tap_result "$([ $rc = 2 ] &&
              grep -q "other config: train.steps is $STEPS in the checkpoint, 10 now" "$tmp/d.err" &&
              [ "$(snapshot "$tmp/b")" = "$before" ]; echo $?)" \
    "--resume without --config, train.steps changed: exit 2, nothing changed" \
    "exit $rc; $(cat "$tmp/d.err"); changed: $(diff <(echo "$before") <(snapshot "$tmp/b"))"

# A fresh run into the directory of a preempted one: refused, naming --resume.
"$HEARTH_TRAIN" "${ARGS[@]}" --out "$tmp/b" >/dev/null 2>"$tmp/e.err"
rc=$?
tap_result "$([ $rc = 2 ] && grep -q -- "holds the results of an earlier run .*--resume $tmp/b continues" "$tmp/e.err" &&
              [ "$(snapshot "$tmp/b")" = "$before" ]; echo $?)" \
    "a fresh run into a run directory with a checkpoint: exit 2, nothing changed" \
    "exit $rc; $(cat "$tmp/e.err")"
