# Shared by tests/cli/hearth_*.sh (sourced after lib.sh; not a test itself: run.sh only
# runs *.sh).  Each test works in its own temporary directory, with tiny and fast runs:
# a few steps of tiny-vlm at a short sequence length (a fraction of a second each).
ROOT=$(pwd)
HEARTH_ABS="$ROOT/$HEARTH"
TRAIN_ABS="$ROOT/$HEARTH_TRAIN"
export HEARTH_KILL_GRACE_MS=1500
unset HEARTH_DB HEARTH_RUNS_DIR HEARTH_BACKEND

# hearth_tmp NAME: a fresh directory in $T, removed at exit; the test cds into it.
hearth_tmp() {
    T=$(mktemp -d "${TMPDIR:-/tmp}/hearth-cli-$1.XXXXXX")
    trap 'hearth_cleanup' EXIT
    # The user's config file (user_config.h) must not change what a test sees.
    export XDG_CONFIG_HOME="$T/.config"
    cd "$T" || exit 1
}

# Kills what a test left running (detached runners, jobs), by the pids it recorded.
hearth_cleanup() {
    [ -n "${KEEP:-}" ] && { echo "# kept $T"; return; }
    local f pid
    while IFS= read -r -d '' f; do
        flock -n "$f" true 2>/dev/null && continue
        pid=$(cut -d' ' -f1 <"$f" 2>/dev/null)
        [ -n "$pid" ] && [ "$pid" -gt 1 ] 2>/dev/null && kill -9 -- "-$pid" "$pid" 2>/dev/null
    done < <(find "$T" \( -name job.lock -o -name runner.lock \) -print0 2>/dev/null)
    cd / && rm -rf "$T"
}

# The base of every spec: tiny-vlm, short sequences, small images.
TINY_BASE='base:
  model: tiny-vlm
  train: {steps: 3, seq_len: 32, micro_batch: 1, global_batch: 1, warmup: 0, measure_from: 1}
  data: {images_min: 1, images_max: 1, image_px_min: 16, image_px_max: 16}'

# A trainer that records each invocation (config hash and run id) in $T/invocations.log,
# can be held back while $T/hold exists (RUN_DIR/.held says it is), slowed down ($T/slow holds seconds), made to fail
# ($T/fail holds an exit code) or to fail the first attempt of each run only
# ($T/fail_once), then runs hearth-train.
make_trainer() {
    cat >"$T/trainer.sh" <<EOF
#!/bin/bash
echo "\$HEARTH_CONFIG_HASH \$HEARTH_RUN_ID" >>"$T/invocations.log"
[ -f "$T/hold" ] && : >"\$HEARTH_RUN_DIR/.held"
while [ -f "$T/hold" ]; do sleep 0.1; done
[ -f "$T/slow" ] && sleep "\$(cat "$T/slow")"
[ -f "$T/fail" ] && exit "\$(cat "$T/fail")"
if [ -f "$T/fail_once" ] && [ ! -e "\$HEARTH_RUN_DIR/.failed_once" ]; then
    : >"\$HEARTH_RUN_DIR/.failed_once"
    echo "failing the first attempt on purpose" >&2
    exit 1
fi
exec "$TRAIN_ABS" "\$@"
EOF
    chmod +x "$T/trainer.sh"
}

# sql QUERY: runs QUERY on the test's database.
sql() { sqlite3 -batch -noheader -cmd '.timeout 10000' "$T/h.db" "$1"; }

# h ARGS...: hearth with the test's database.
h() { "$HEARTH_ABS" --db "$T/h.db" "$@"; }

# run_h NAME ARGS...: hearth with the test's database; stdout, stderr, status in $T/NAME.*
run_h() {
    local name=$1; shift
    "$HEARTH_ABS" --db "$T/h.db" "$@" >"$T/$name.out" 2>"$T/$name.err"
    echo $? >"$T/$name.rc"
}
rc_is() {   # rc_is NAME CODE
    local got; got=$(cat "$T/$1.rc")
    [ "$got" = "$2" ] || { echo "$1: exit status $got, want $2"; cat "$T/$1.err"; return 1; }
}

# wait_for SECONDS CMD...: polls CMD every 0.1 s until it succeeds (1 on timeout).
wait_for() {
    local limit=$1 i=0; shift
    while ! "$@" >/dev/null 2>&1; do
        i=$((i + 1))
        [ "$i" -ge $((limit * 10)) ] && return 1
        sleep 0.1
    done
}
