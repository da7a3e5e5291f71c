#!/usr/bin/env bash
# hearth-train --check-bootstrap across processes: one rank alone; 4 processes with
# torchrun-style variables and the TCP rendezvous on 127.0.0.1 (and a rank that never
# comes: a clean timeout naming it); PMIx under OpenMPI's mpirun (-n 4, no Slurm); PMIx
# under `srun --mpi=pmix -N2 -n4` on the test cluster of contrib/slurm-local (started by
# make test; skipped only where srun is not installed); srun without PMIx refused.
set -u
cd "$(dirname "$0")/../.."
. tests/cli/lib.sh

tmp=$(mktemp -d "${TMPDIR:-/tmp}/hearth-cli-bootstrap.XXXXXX")
pids=()
cleanup() {
    local p
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
    rm -rf "$tmp"
}
trap cleanup EXIT
TRAIN=$(cd "$(dirname "$HEARTH_TRAIN")" && pwd)/$(basename "$HEARTH_TRAIN")

# Every launcher variable that would steer the bootstrap, removed for a clean start.
CLEAN=(env -u RANK -u WORLD_SIZE -u LOCAL_RANK -u MASTER_ADDR -u MASTER_PORT
       -u PMIX_RANK -u PMIX_NAMESPACE -u SLURM_MPI_TYPE -u SLURM_STEP_NUM_TASKS
       -u HEARTH_BOOTSTRAP -u HEARTH_BOOTSTRAP_TIMEOUT)

tap_plan 11

# check_view FILE N: FILE holds the reports of N ranks; each rank passed, and every rank
# printed the very same blob lines (rank prefix removed).
check_view() {
    local f=$1 n=$2 r
    [ "$(grep -c "bootstrap check passed: $n ranks, identical views" "$f")" -eq "$n" ] || return 1
    [ "$(grep -c 'FAIL' "$f")" -eq 0 ] || return 1
    for r in $(seq 0 $((n - 1))); do
        grep -q "^rank $r: bootstrap [a-z]*: rank $r of $n, local rank" "$f" || return 1
        # rank r's view: n blob lines, in order, naming ranks 0..n-1
        grep "^rank $r: blob from rank " "$f" | sed "s/^rank $r: //" >"$tmp/view.$r"
        [ "$(wc -l <"$tmp/view.$r")" -eq "$n" ] || return 1
        [ "$(grep -c '^blob from rank \([0-9]*\): "rank \1 of '"$n"' ' "$tmp/view.$r")" -eq "$n" ] ||
            return 1
        [ "$r" -eq 0 ] || cmp -s "$tmp/view.0" "$tmp/view.$r" || return 1
    done
}

# 1. --help documents the option.
"$HEARTH_TRAIN" --help | grep -q -- '--check-bootstrap'
tap_result $? "--help mentions --check-bootstrap"

# 2. Alone: one rank, passes.
out=$("${CLEAN[@]}" "$HEARTH_TRAIN" --check-bootstrap 2>&1)
rc=$?
[ $rc -eq 0 ] && echo "$out" | grep -q 'bootstrap single: rank 0 of 1' &&
    echo "$out" | grep -q 'check passed: 1 rank, identical views'
tap_result $? "single rank" "exit $rc: $out"

# A port that nothing listens on now (a connection attempt is refused).
pick_port() {
    local p i
    for i in $(seq 50); do
        p=$((20000 + RANDOM % 40000))
        (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
    done
    echo 29500
}

# env_run N PRESENT TIMEOUT [VAR=VALUE...]: launches the ranks listed in PRESENT (of N)
# with the torchrun variables (and the extra ones), waits, and leaves rank R's
# stdout+stderr in $tmp/env.R and its exit status in $tmp/env.R.rc.  Retries with another
# port if rank 0 could not listen.
env_run() {
    local n=$1 present=$2 timeout=$3 r attempt port
    shift 3
    for attempt in 1 2 3; do
        port=$(pick_port)
        pids=()
        rm -f "$tmp"/env.*
        for r in $present; do
            ( "${CLEAN[@]}" RANK=$r WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
                  HEARTH_BOOTSTRAP_TIMEOUT=$timeout "$@" "$HEARTH_TRAIN" --check-bootstrap \
                  >"$tmp/env.$r" 2>&1
              echo $? >"$tmp/env.$r.rc" ) &
            pids+=($!)
        done
        for r in "${pids[@]}"; do wait "$r"; done
        pids=()
        grep -q 'cannot listen' "$tmp/env.0" 2>/dev/null || return 0
    done
}

# 3. Four processes, environment variables, TCP rendezvous.
env_run 4 "0 1 2 3" 60
cat "$tmp"/env.[0-3] >"$tmp/env.all"
ok=0
for r in 0 1 2 3; do [ "$(cat "$tmp/env.$r.rc")" = 0 ] || ok=1; done
[ $ok -eq 0 ] && check_view "$tmp/env.all" 4 && grep -q 'bootstrap env: rank 3 of 4' "$tmp/env.all"
tap_result $? "env bootstrap: 4 processes on 127.0.0.1 agree" "$(cat "$tmp/env.all")"

# 4. A rank that never comes: both others fail after the timeout, naming rank 2.
start=$(date +%s)
env_run 3 "0 1" 2
took=$(( $(date +%s) - start ))
[ "$(cat "$tmp/env.0.rc")" = 1 ] && [ "$(cat "$tmp/env.1.rc")" = 1 ] &&
    grep -q 'waiting for rank 2 (of 3) to connect' "$tmp/env.0" &&
    grep -q 'rank 0 gave up: .*rank 2 (of 3)' "$tmp/env.1" && [ "$took" -le 20 ]
tap_result $? "env bootstrap: a missing rank times out, named" \
    "took ${took}s; rank 0: $(cat "$tmp/env.0"); rank 1: $(cat "$tmp/env.1")"

# 5. Wrong LOCAL_RANK values (both ranks of this host claim 0): the check fails, naming it.
env_run 2 "0 1" 30 LOCAL_RANK=0
[ "$(cat "$tmp/env.0.rc")" = 1 ] && [ "$(cat "$tmp/env.1.rc")" = 1 ] &&
    grep -q 'FAIL: rank 1 has local rank 0 on .* (taken twice)' "$tmp/env.0" &&
    grep -q 'check FAILED' "$tmp/env.1"
tap_result $? "env bootstrap: duplicate local ranks fail the check" \
    "rank 0: $(cat "$tmp/env.0"); rank 1: $(cat "$tmp/env.1")"

# 6. Bad variables: usage error naming the variable.
out=$("${CLEAN[@]}" RANK=5 WORLD_SIZE=4 "$HEARTH_TRAIN" --check-bootstrap 2>&1)
rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q 'RANK=5: expected 0..3'
tap_result $? "env bootstrap: RANK out of range is a usage error" "exit $rc: $out"

# 7. PMIx forced without a server: a clean runtime error, not a hang.
out=$("${CLEAN[@]}" HEARTH_BOOTSTRAP=pmix timeout 60 "$HEARTH_TRAIN" --check-bootstrap 2>&1)
rc=$?
[ $rc -eq 1 ] && echo "$out" | grep -q 'PMIx_Init'
tap_result $? "pmix without a server fails cleanly" "exit $rc: $out"

# 8. PMIx through OpenMPI's mpirun (its own PMIx server; no Slurm).
if command -v mpirun >/dev/null 2>&1; then
    root=()
    [ "$(id -u)" -eq 0 ] && root=(--allow-run-as-root)
    "${CLEAN[@]}" timeout 120 mpirun "${root[@]}" --oversubscribe --bind-to none -n 4 \
        "$TRAIN" --check-bootstrap >"$tmp/mpirun.out" 2>&1
    rc=$?
    [ $rc -eq 0 ] && grep -q 'bootstrap pmix: rank 0 of 4' "$tmp/mpirun.out" &&
        check_view "$tmp/mpirun.out" 4
    tap_result $? "pmix bootstrap under mpirun -n 4" "exit $rc: $(cat "$tmp/mpirun.out")"
else
    tap_result 1 "pmix bootstrap under mpirun -n 4" \
        "mpirun not found: run contrib/install-deps.sh (openmpi-bin)"
fi

# 9-11. Slurm: the test cluster (make test starts it and sets SLURM_CONF).
if ! command -v srun >/dev/null 2>&1; then
    tap_skip "srun --mpi=pmix -N2 -n4 --check-bootstrap" "srun not installed"
    tap_skip "two nodes seen through PMIx" "srun not installed"
    tap_skip "srun without --mpi=pmix is refused" "srun not installed"
    exit 0
fi
export SLURM_CONF=${SLURM_CONF:-${HEARTH_SLURM_DIR:-/tmp/hearth-slurm}/slurm.conf}
timeout 120 env -u SLURM_MPI_TYPE srun --mpi=pmix -N2 -n4 -J hearth-bootstrap-test \
    "$TRAIN" --check-bootstrap >"$tmp/srun.out" 2>&1
rc=$?
[ $rc -eq 0 ] && grep -q 'bootstrap pmix: rank 0 of 4' "$tmp/srun.out" &&
    check_view "$tmp/srun.out" 4
tap_result $? "srun --mpi=pmix -N2 -n4 --check-bootstrap" \
    "SLURM_CONF=$SLURM_CONF exit $rc: $(cat "$tmp/srun.out")"

# Two nodes, two ranks each, local ranks 0 and 1 on each.
nodes=$(sed -n 's/^rank [0-9]*: bootstrap pmix: .*, node \([^,]*\), pid .*/\1/p' "$tmp/srun.out" |
        sort -u | wc -l)
locals=$(sed -n 's/^rank [0-9]*: bootstrap pmix: .*, local rank \([0-9]*\), .*/\1/p' \
        "$tmp/srun.out" | sort | tr -d '\n')
[ "$nodes" -eq 2 ] && [ "$locals" = 0011 ]
tap_result $? "two nodes seen through PMIx" "nodes $nodes, local ranks $locals"

timeout 120 env -u SLURM_MPI_TYPE srun --mpi=none -N1 -n2 -J hearth-bootstrap-test \
    "$TRAIN" --check-bootstrap >"$tmp/srun-none.out" 2>&1
rc=$?
[ $rc -ne 0 ] && grep -q 'srun started 2 tasks without PMIx' "$tmp/srun-none.out"
tap_result $? "srun without --mpi=pmix is refused" "exit $rc: $(cat "$tmp/srun-none.out")"
