#!/usr/bin/env bash
# Stops a cluster started by start.sh: kills the daemons recorded in DIR/run/*.pid (and only
# those), waits for them to end.  Safe to run again, and on an instance that never started.
#
#   contrib/slurm-local/stop.sh [--dir DIR] [--purge]
#
# --purge also removes DIR.  DIR: --dir, else HEARTH_SLURM_DIR, else /tmp/hearth-slurm.
set -uo pipefail
DIR=${HEARTH_SLURM_DIR:-/tmp/hearth-slurm}
purge=
while [ $# -gt 0 ]; do
    case "$1" in
    --dir) DIR=$2; shift 2 ;;
    --purge) purge=1; shift ;;
    -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
    *) echo "stop.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
[ -d "$DIR/run" ] || { [ -n "$purge" ] && rm -rf "$DIR"; exit 0; }

# slurmrestd and slurmd first (they run the jobs), then slurmctld, then slurmdbd and its
# MariaDB (start.sh --with-dbd), then munged.  One group at a time: slurmctld sends its last
# records to slurmdbd as it ends, slurmdbd writes them to MariaDB.
stop_group() {
    local f p pids=() left=()
    for f in "$@"; do
        [ -f "$f" ] || continue
        p=$(cat "$f" 2>/dev/null)
        if [ -n "$p" ] && kill -0 "$p" 2>/dev/null; then
            kill -TERM "$p" 2>/dev/null && pids+=("$p")
        fi
        rm -f "$f"
    done
    for _ in $(seq 100); do
        left=()
        for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && left+=("$p"); done
        [ "${#left[@]}" -eq 0 ] && break
        sleep 0.1
    done
    for p in "${left[@]}"; do kill -KILL "$p" 2>/dev/null; done
}
stop_group "$DIR/run/slurmrestd.pid" "$DIR"/run/slurmd-*.pid "$DIR/run/slurmctld.pid"
stop_group "$DIR/run/slurmdbd.pid"
stop_group "$DIR/run/mariadb.pid"
stop_group "$DIR/run/munged.pid"
[ -n "$purge" ] && rm -rf "$DIR"
echo "slurm-local: stopped ($DIR)" >&2
exit 0
