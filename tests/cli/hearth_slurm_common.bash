# Shared by tests/cli/hearth_slurm*.sh (sourced from the repository root; it sources lib.sh
# and hearth_common.bash itself): the test clusters of contrib/slurm-local (make test starts
# them: HEARTH_SLURM_DIR, default /tmp/hearth-slurm; the one with accounting,
# HEARTH_SLURM_DBD_DIR, default /tmp/hearth-slurm-dbd), and wrappers on PATH that log every
# sbatch/squeue/scontrol/scancel/sacct call into $T/calls.log ("TOOL ARGS...") before running
# the real one.  A test begins with
#     . tests/cli/hearth_slurm_common.bash
#     slurm_test NAME PREFIX [dbd]
. tests/cli/lib.sh
. tests/cli/hearth_common.bash
SLURM_DIR=${HEARTH_SLURM_DIR:-/tmp/hearth-slurm}
export SLURM_CONF=${SLURM_CONF:-$SLURM_DIR/slurm.conf}
export HEARTH_SLURM_POLL_MS=${HEARTH_SLURM_POLL_MS:-500}
SLURM_DOWN_NODE=    # set down by slurm_node_down: resumed at exit
SLURM_DEAD_NODE=    # slurmd killed by slurm_node_kill: restarted at exit

# slurm_test NAME PREFIX [dbd]: the test's directory ($T, hearth_tmp NAME), the trainer
# (make_trainer) and slurm_setup PREFIX; with `dbd`, on the instance that keeps accounting.
slurm_test() {
    if [ "${3:-}" = dbd ]; then
        SLURM_DIR=${HEARTH_SLURM_DBD_DIR:-/tmp/hearth-slurm-dbd}
        export SLURM_CONF=$SLURM_DIR/slurm.conf
    fi
    hearth_tmp "$1"
    make_trainer
    slurm_setup "$2"
}

# slurm_setup PREFIX: checks the cluster answers (else the test fails), puts the wrappers
# first on PATH, and at exit brings back a node the test took down and cancels every job
# whose name starts with PREFIX (the test's experiment names must start with it).  Call
# after hearth_tmp.
slurm_setup() {
    SLURM_TEST_PREFIX=$1
    if ! sinfo -h >/dev/null 2>&1; then
        echo "1..1"
        echo "not ok 1 - the test Slurm cluster answers (SLURM_CONF=$SLURM_CONF; start it with contrib/slurm-local/start.sh)"
        exit 1
    fi
    mkdir -p "$T/bin"
    local tool real
    for tool in sbatch squeue scontrol scancel sacct; do
        real=$(command -v "$tool")
        cat >"$T/bin/$tool" <<EOF
#!/bin/bash
echo "$tool \$*" >>"$T/calls.log"
if [ "$tool" = sbatch ] && [ -f "$T/kill_after_sbatch" ]; then
    # Simulates a crash of hearth right after sbatch: the job exists, hearth never
    # learns its id.
    out=\$("$real" "\$@"); rc=\$?
    echo "\$out" >>"$T/sbatch_ids"
    rm -f "$T/kill_after_sbatch"
    kill -9 \$PPID
    echo "\$out"; exit \$rc
fi
exec "$real" "\$@"
EOF
        chmod +x "$T/bin/$tool"
    done
    export PATH="$T/bin:$PATH"
    trap 'slurm_cleanup; hearth_cleanup' EXIT
}

slurm_cleanup() {
    # Whatever happened, the nodes come back for the tests that follow.
    [ -n "$SLURM_DOWN_NODE" ] && slurm_node_resume
    [ -n "$SLURM_DEAD_NODE" ] && slurm_node_restart
    [ -n "${KEEP:-}" ] && return
    local ids
    ids=$(squeue -h -o '%i %j' 2>/dev/null | awk -v p="$SLURM_TEST_PREFIX" 'index($2, p) == 1 {print $1}')
    [ -n "$ids" ] && scancel $ids 2>/dev/null
    return 0
}

# slurm_node_down NODE: sets NODE DOWN (its jobs end NODE_FAIL); slurm_node_resume brings it
# back (ReturnToService=2 does at once).  Neither goes through the wrappers' log.
slurm_node_down() {
    SLURM_DOWN_NODE=$1
    PATH=${PATH#"$T/bin:"} scontrol update nodename="$1" state=down reason=hearth-test
}
slurm_node_resume() {
    PATH=${PATH#"$T/bin:"} scontrol update nodename="$SLURM_DOWN_NODE" state=resume >/dev/null 2>&1 &&
        SLURM_DOWN_NODE=
}

# slurm_node_kill NODE: kills NODE's slurmd with SIGKILL (its jobs' processes live on,
# orphaned, until it comes back); slurm_node_restart starts it again (start.sh restarts
# what died, and slurmd then ends the jobs slurmctld no longer gives it), output in
# $T/restart.log.
slurm_node_kill() {
    SLURM_DEAD_NODE=$1
    kill -9 "$(cat "$SLURM_DIR/run/slurmd-$1.pid" 2>/dev/null)" 2>/dev/null
}
slurm_node_restart() {
    # Only the directory: a running instance keeps its own ports, nodes and daemons.
    env -u HEARTH_SLURM_REST_PORT -u HEARTH_SLURM_DBD HEARTH_SLURM_DIR="$SLURM_DIR" \
        PATH="${PATH#"$T/bin:"}" "$ROOT/contrib/slurm-local/start.sh" >"$T/restart.log" 2>&1 &&
        SLURM_DEAD_NODE=
}

# slurmrest_setup: the cluster's slurmrestd (make test starts it with --rest
# $HEARTH_SLURM_REST_PORT; a token for root in DIR/rest/token), else the test fails;
# exports HEARTH_SLURMREST_URL and HEARTH_SLURMREST_TOKEN_FILE, sets REST_PORT, TOKEN_FILE,
# TOKEN and RESTLOG (slurmrestd's log: a line per request).
slurmrest_setup() {
    REST_PORT=${HEARTH_SLURM_REST_PORT:-}
    TOKEN_FILE=$SLURM_DIR/rest/token
    if [ -z "$REST_PORT" ] || [ ! -s "$TOKEN_FILE" ]; then
        echo "1..1"
        echo "not ok 1 - slurmrestd of the test cluster (HEARTH_SLURM_REST_PORT=$REST_PORT, $TOKEN_FILE; start it with contrib/slurm-local/start.sh --rest PORT)"
        exit 1
    fi
    export HEARTH_SLURMREST_URL=http://127.0.0.1:$REST_PORT
    export HEARTH_SLURMREST_TOKEN_FILE=$TOKEN_FILE
    TOKEN=$(cat "$TOKEN_FILE")
    RESTLOG=$SLURM_DIR/log/slurmrestd.log
}

# calls TOOL: how many times TOOL ran.
calls() { grep -c "^$1 " "$T/calls.log" 2>/dev/null || true; }

# sql QUERY, with a busy timeout: a runner may be writing the database at that moment.
sql() { sqlite3 -batch -noheader -cmd '.timeout 10000' "$T/h.db" "$1"; }

# real TOOL ARGS...: the real Slurm command, not logged in calls.log.
real() { PATH=${PATH#"$T/bin:"} "$@"; }

# A one-run experiment NAME whose trainer exits with a random code, submitted through
# BACKEND: `hearth submit` exits 1 and the run is failed with that code after one attempt.
# Needs ./trainer.sh (exits with the code in ./fail) and $TINY_BASE.  LABEL ends the
# test's description.  (The check reads globals: tap_check's own locals would shadow
# this function's.)
slurm_check_failing_run() {
    fail_run_id=$1-1
    printf 'name: %s\ntrainer: ./trainer.sh\n%s\nretries: 0\n' "$1" "$TINY_BASE" >f.yaml
    fail_code=$(( RANDOM % 50 + 3 ))
    echo "$fail_code" >fail
    run_h fail submit f.yaml --backend "$2"
    rm -f fail
    fail_ok() {
        rc_is fail 1 || return 1
        [ "$(sql "select state, exit_code, attempts from runs where run_id = '$fail_run_id'")" = "failed|$fail_code|1" ] ||
            { sql "select run_id, state, exit_code, attempts from runs"; cat fail.err; return 1; }
        grep -q "exit code $fail_code" fail.err
    }
    tap_check "a run exiting with $fail_code$3: failed, exit code $fail_code recorded" fail_ok
}
