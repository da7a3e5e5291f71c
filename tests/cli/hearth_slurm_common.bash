# Shared by tests/cli/hearth_slurm_*.sh (sourced after lib.sh and hearth_common.bash): the
# test cluster of contrib/slurm-local (make test starts it; HEARTH_SLURM_DIR says where,
# default /tmp/hearth-slurm), and wrappers on PATH that log every sbatch/squeue/scontrol/
# scancel call into $T/calls.log ("TOOL ARGS...") before running the real one.
SLURM_DIR=${HEARTH_SLURM_DIR:-/tmp/hearth-slurm}
export SLURM_CONF=${SLURM_CONF:-$SLURM_DIR/slurm.conf}
export HEARTH_SLURM_POLL_MS=${HEARTH_SLURM_POLL_MS:-500}

# slurm_setup PREFIX: checks the cluster answers (else the test fails), puts the wrappers
# first on PATH, and cancels at exit every job whose name starts with PREFIX (the test's
# experiment names must start with it).  Call after hearth_tmp.
slurm_setup() {
    SLURM_TEST_PREFIX=$1
    if ! sinfo -h >/dev/null 2>&1; then
        echo "1..1"
        echo "not ok 1 - the test Slurm cluster answers (SLURM_CONF=$SLURM_CONF; start it with contrib/slurm-local/start.sh)"
        exit 1
    fi
    mkdir -p "$T/bin"
    local tool real
    for tool in sbatch squeue scontrol scancel; do
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
    [ -n "${KEEP:-}" ] && return
    local ids
    ids=$(squeue -h -o '%i %j' 2>/dev/null | awk -v p="$SLURM_TEST_PREFIX" 'index($2, p) == 1 {print $1}')
    [ -n "$ids" ] && scancel $ids 2>/dev/null
    return 0
}

# calls TOOL: how many times TOOL ran.
calls() { grep -c "^$1 " "$T/calls.log" 2>/dev/null || true; }

# sql QUERY, with a busy timeout: a runner may be writing the database at that moment.
sql() { sqlite3 -batch -noheader -cmd '.timeout 10000' "$T/h.db" "$1"; }
