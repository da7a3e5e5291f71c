#!/usr/bin/env bash
# Starts a throw-away Slurm cluster on this host: munged, slurmctld and K slurmd (simulated
# nodes n1..nK), all as root, without systemd or cgroups, everything under one instance
# directory.  Safe to run again: a running, healthy instance is left as it is.
#
#   contrib/slurm-local/start.sh [--dir DIR] [--port-base PORT] [--nodes K] [--cpus C]
#                                [--gpus G] [--max-array-size N] [--rest PORT] [--with-dbd]
#   then: export SLURM_CONF=DIR/slurm.conf      (or: . DIR/env.sh)
#
# --rest PORT also starts slurmrestd on 127.0.0.1:PORT with JWT authentication (as user
# slurm, openapi/v0.0.38) and writes a token for root to DIR/rest/token (mode 600).
# --with-dbd also starts MariaDB (datadir DIR/mysql, 127.0.0.1:P+K+2) and slurmdbd
# (127.0.0.1:P+K+1), and slurmctld stores accounting there: sacct works.
#
# Options have environment equivalents (options win): HEARTH_SLURM_DIR (/tmp/hearth-slurm),
# HEARTH_SLURM_PORT_BASE (16817: slurmctld; slurmd use the next K ports),
# HEARTH_SLURM_NODES (2), HEARTH_SLURM_CPUS (CPUs per node, 2), HEARTH_SLURM_GPUS
# (simulated GPUs per node: gres gpu on stand-in device files; 2),
# HEARTH_SLURM_MAX_ARRAY_SIZE (1001), HEARTH_SLURM_MIN_JOB_AGE (300 s),
# HEARTH_SLURM_SLURMD_TIMEOUT (300 s), HEARTH_SLURM_REST_PORT (none),
# HEARTH_SLURM_TOKEN_LIFESPAN (86400 s), HEARTH_SLURM_DBD (1: --with-dbd).  Two instances
# coexist when their directories and port ranges (P..P+K, with --with-dbd P..P+K+2) differ.
# Run again on a running instance, it restarts what died (a killed slurmd, say) with that
# instance's own slurm.conf.  See README.md.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

DIR=${HEARTH_SLURM_DIR:-/tmp/hearth-slurm}
PORT=${HEARTH_SLURM_PORT_BASE:-16817}
NODES=${HEARTH_SLURM_NODES:-2}
CPUS=${HEARTH_SLURM_CPUS:-2}
GPUS=${HEARTH_SLURM_GPUS:-2}
MAXARR=${HEARTH_SLURM_MAX_ARRAY_SIZE:-1001}
MINAGE=${HEARTH_SLURM_MIN_JOB_AGE:-300}
SDTIMEOUT=${HEARTH_SLURM_SLURMD_TIMEOUT:-300}
REST=${HEARTH_SLURM_REST_PORT:-}
LIFESPAN=${HEARTH_SLURM_TOKEN_LIFESPAN:-86400}
DBD=${HEARTH_SLURM_DBD:-}
[ "$DBD" = 0 ] && DBD=
while [ $# -gt 0 ]; do
    case "$1" in
    --dir) DIR=$2; shift 2 ;;
    --port-base) PORT=$2; shift 2 ;;
    --nodes) NODES=$2; shift 2 ;;
    --cpus) CPUS=$2; shift 2 ;;
    --gpus) GPUS=$2; shift 2 ;;
    --max-array-size) MAXARR=$2; shift 2 ;;
    --rest) REST=$2; shift 2 ;;
    --with-dbd) DBD=1; shift ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) echo "start.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
case "$DIR" in /*) ;; *) DIR=$(pwd)/$DIR ;; esac
case "$REST" in ''|[0-9]*) ;; *) echo "start.sh: --rest $REST: expected a port number" >&2; exit 2 ;; esac
case "$GPUS" in [1-9]|[1-9][0-9]) ;; *) echo "start.sh: --gpus $GPUS: expected a number of GPUs per node (1-99)" >&2; exit 2 ;; esac

say() { echo "slurm-local: $*" >&2; }
die() { say "$*"; for f in "$DIR"/log/*.log; do [ -f "$f" ] && { echo "--- $f" >&2; tail -n 20 "$f" >&2; }; done; exit 1; }

[ "$(id -u)" -eq 0 ] || die "must run as root (slurmd runs jobs as their users)"
for b in munged slurmctld slurmd sinfo srun; do
    command -v "$b" >/dev/null || die "$b not found: run contrib/install-deps.sh (slurm-wlm, slurm-client, munge)"
done
if [ -n "$REST" ]; then
    command -v slurmrestd >/dev/null || die "slurmrestd not found: run contrib/install-deps.sh (slurmrestd, slurm-wlm-jwt-plugin)"
    id slurm >/dev/null 2>&1 || die "no user slurm to run slurmrestd as (it refuses root): install slurmrestd"
fi
if [ -n "$DBD" ]; then
    for b in slurmdbd sacct mariadbd mariadb-install-db mariadb; do
        command -v "$b" >/dev/null || die "$b not found: run contrib/install-deps.sh (slurmdbd, mariadb-server)"
    done
fi
DBD_PORT=$((PORT + NODES + 1))
SQL_PORT=$((PORT + NODES + 2))

alive() {   # alive NAME: the daemon recorded in DIR/run/NAME.pid lives
    local p
    p=$(cat "$DIR/run/$1.pid" 2>/dev/null) || return 1
    [ -n "$p" ] && kill -0 "$p" 2>/dev/null
}

export SLURM_CONF="$DIR/slurm.conf"

# The config asks for JWT exactly when --rest does: a change needs a restart (stop.sh).
jwt_configured() { grep -q '^AuthAltTypes=auth/jwt' "$DIR/slurm.conf" 2>/dev/null; }
dbd_configured() { grep -q '^AccountingStorageType=accounting_storage/slurmdbd' "$DIR/slurm.conf" 2>/dev/null; }

healthy() {
    alive munged && alive slurmctld || return 1
    [ -z "$REST" ] || alive slurmrestd || return 1
    [ -z "$DBD" ] || { alive mariadb && alive slurmdbd; } || return 1
    for i in $(seq 1 "$NODES"); do alive "slurmd-n$i" || return 1; done
    [ -z "$(sinfo -h -o '%t' 2>/dev/null | grep -vE '^idle|^mix|^alloc')" ] &&
        [ -n "$(sinfo -h -o '%t' 2>/dev/null)" ]
}

# A token for root (DIR/rest/token, mode 600) from slurmctld: made at every start, so that
# running start.sh again renews it.  SLURM_JWT is never exported here (scontrol would use it).
write_token() {
    local t
    t=$(env -u SLURM_JWT scontrol token username=root lifespan="$LIFESPAN" 2>&1) ||
        die "scontrol token failed: $t"
    t=${t#SLURM_JWT=}
    ( umask 077; printf '%s\n' "$t" >"$DIR/rest/token.tmp" ) && mv -f "$DIR/rest/token.tmp" "$DIR/rest/token" ||
        die "cannot write $DIR/rest/token"
}

# Whether slurmrestd answers a ping authenticated with DIR/rest/token (plain bash: no curl
# needed; the token never appears on a command line).
rest_ping() {
    local line
    line=$( exec 2>/dev/null; exec 3<>"/dev/tcp/127.0.0.1/$REST" || exit 1
        printf 'GET /slurm/v0.0.38/ping HTTP/1.0\r\nHost: 127.0.0.1\r\nX-SLURM-USER-NAME: root\r\nX-SLURM-USER-TOKEN: %s\r\n\r\n' \
            "$(cat "$DIR/rest/token")" >&3
        read -r -t 5 l <&3 && echo "$l" )
    case "$line" in "HTTP/"*" 200"*) return 0 ;; esac
    return 1
}

if [ -f "$DIR/slurm.conf" ] && alive slurmctld; then
    if [ -n "$REST" ] && ! jwt_configured; then
        die "the instance in $DIR runs without JWT: stop it (stop.sh --dir $DIR) and start it again with --rest"
    fi
    if [ -n "$DBD" ] && ! dbd_configured; then
        die "the instance in $DIR runs without slurmdbd: stop it (stop.sh --dir $DIR) and start it again with --with-dbd"
    fi
    # The running instance's own ports and nodes, whatever this call's options say.
    PORT=$(sed -n 's/^SlurmctldPort=//p' "$DIR/slurm.conf")
    NODES=$(sed -n 's/^NodeName=n\[1-\([0-9]*\)\].*/\1/p' "$DIR/slurm.conf")
    DBD_PORT=$((PORT + NODES + 1))
    SQL_PORT=$((PORT + NODES + 2))
    ! dbd_configured || DBD=1
    if healthy; then
        [ -z "$REST" ] || write_token
        say "already running in $DIR (export SLURM_CONF=$SLURM_CONF)"
        exit 0
    fi
fi

mkdir -p "$DIR"/{run,log,state,munge}
chmod 755 "$DIR"   # slurmrestd (user slurm) reads slurm.conf here
chmod 700 "$DIR/munge"

# ---- munge: its own key and socket, so that it never meets a system munged ----
if ! alive munged; then
    [ -s "$DIR/munge/munge.key" ] || { dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none; chmod 400 "$DIR/munge/munge.key"; }
    rm -f "$DIR/munge/munge.socket"*
    setsid munged -F --force --key-file="$DIR/munge/munge.key" \
        --socket="$DIR/munge/munge.socket" --pid-file="$DIR/munge/munged.pid" \
        --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/munged.seed" \
        </dev/null >>"$DIR/log/munged.out" 2>&1 &
    echo $! >"$DIR/run/munged.pid"
    for _ in $(seq 50); do [ -S "$DIR/munge/munge.socket" ] && break; sleep 0.1; done
    [ -S "$DIR/munge/munge.socket" ] || die "munged did not start"
fi

# ---- JWT key for slurmrestd's clients (32 random bytes, read by slurmctld) ----
alt=
if [ -n "$REST" ]; then
    mkdir -p "$DIR/rest"
    chmod 700 "$DIR/rest"
    if [ ! -s "$DIR/rest/jwt.key" ]; then
        ( umask 077; dd if=/dev/urandom of="$DIR/rest/jwt.key" bs=32 count=1 status=none )
    fi
    chmod 600 "$DIR/rest/jwt.key"
    chown slurm:slurm "$DIR/rest" "$DIR/rest/jwt.key"
    alt="AuthAltTypes=auth/jwt\nAuthAltParameters=jwt_key=$DIR/rest/jwt.key"
fi

# ---- slurm.conf: rendered only while slurmctld is down (a running one keeps its own) ----
# AccountingStoragePass: the munge socket for connections to slurmdbd (AuthInfo is not used there).
acct="AccountingStorageType=accounting_storage/none"
[ -z "$DBD" ] || acct="AccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageHost=localhost\nAccountingStoragePort=$DBD_PORT\nAccountingStoragePass=$DIR/munge/munge.socket"
last=$((PORT + NODES))
if ! alive slurmctld; then
    sed -e "s|@DIR@|$DIR|g" -e "s|@CLUSTER@|hearth$PORT|g" -e "s|@CTLD_PORT@|$PORT|g" \
        -e "s|@NODES@|$NODES|g" -e "s|@SLURMD_PORTS@|$((PORT + 1))-$last|g" -e "s|@CPUS@|$CPUS|g" \
        -e "s|@GPUS@|$GPUS|g" \
        -e "s|@MAX_ARRAY_SIZE@|$MAXARR|g" -e "s|@MIN_JOB_AGE@|$MINAGE|g" \
        -e "s|@SLURMD_TIMEOUT@|$SDTIMEOUT|g" -e "s|@AUTH_ALT@|$alt|" -e "s|@ACCOUNTING@|$acct|" \
        "$here/slurm.conf.in" >"$DIR/slurm.conf.tmp"
    chmod 644 "$DIR/slurm.conf.tmp"
    # gres.conf (read from slurm.conf's directory): simulated GPUs.  Slurm 22.05 drops a
    # GPU without File= ("Removing file-less GPU"), and logs an error for a File= that is
    # not a device, so each GPU is a character device file DIR/gpu/nvidiaI made like
    # /dev/null (a plain file where mknod is not allowed: still counted, with that error).
    mkdir -p "$DIR/gpu"
    for i in $(seq 0 $((GPUS - 1))); do
        [ -e "$DIR/gpu/nvidia$i" ] || mknod "$DIR/gpu/nvidia$i" c 1 3 2>/dev/null ||
            : >"$DIR/gpu/nvidia$i"
    done
    files=nvidia0
    [ "$GPUS" -eq 1 ] || files="nvidia[0-$((GPUS - 1))]"
    printf '# gres.conf of a throw-away Hearth test cluster, written by start.sh: simulated GPUs\nName=gpu File=%s\n' \
        "$DIR/gpu/$files" >"$DIR/gres.conf.tmp"
    chmod 644 "$DIR/gres.conf.tmp"
    mv -f "$DIR/gres.conf.tmp" "$DIR/gres.conf"
    mv -f "$DIR/slurm.conf.tmp" "$DIR/slurm.conf"
fi
cat >"$DIR/env.sh" <<ENV
# . this file to use the cluster in $DIR
export SLURM_CONF='$DIR/slurm.conf'
ENV

# ---- daemons, in the foreground of their own sessions: their pids are ours to record ----

# MariaDB for slurmdbd: its own datadir, socket and TCP port, run as root; slurmdbd logs in
# over TCP as user slurm (a throw-away password: only this host can reach the port).
if [ -n "$DBD" ]; then
    sock="$DIR/mysql.sock"
    sqlc() { mariadb --no-defaults --socket="$sock" -u root "$@"; }
    # A fresh slurmctld (-c) numbers jobs from 1 again: accounting starts afresh with it,
    # so that sacct never answers for a job of an earlier life under the same id.
    fresh_acct=
    if ! alive slurmctld; then
        fresh_acct=1
        if alive slurmdbd; then
            p=$(cat "$DIR/run/slurmdbd.pid")
            kill -TERM "$p"
            for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
            kill -KILL "$p" 2>/dev/null || true
        fi
    fi
    if ! alive mariadb; then
        if [ ! -d "$DIR/mysql/mysql" ]; then
            rm -rf "$DIR/mysql"
            mariadb-install-db --no-defaults --datadir="$DIR/mysql" --user=root --skip-test-db \
                --auth-root-authentication-method=socket >>"$DIR/log/mariadb-install.log" 2>&1 ||
                die "mariadb-install-db failed (see $DIR/log/mariadb-install.log)"
        fi
        rm -f "$sock"
        setsid mariadbd --no-defaults --datadir="$DIR/mysql" --user=root --bind-address=127.0.0.1 \
            --port="$SQL_PORT" --socket="$sock" --pid-file="$DIR/run/mariadb.pid.mariadb" \
            --log-error="$DIR/log/mariadb.log" --skip-log-bin --innodb-buffer-pool-size=32M \
            --innodb-flush-log-at-trx-commit=0 --innodb-doublewrite=0 --innodb-flush-method=nosync \
            </dev/null >>"$DIR/log/mariadb.out" 2>&1 &
        echo $! >"$DIR/run/mariadb.pid"
    fi
    ok=
    for _ in $(seq 150); do
        alive mariadb || die "mariadbd exited"
        sqlc -e 'select 1' >/dev/null 2>&1 && { ok=1; break; }
        sleep 0.1
    done
    [ -n "$ok" ] || die "MariaDB does not answer on $sock"
    [ -z "$fresh_acct" ] || sqlc -e 'DROP DATABASE IF EXISTS slurm_acct_db' || die "cannot reset the accounting database"
    sqlc -e "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm';
             CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurm';
             GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
             GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';" ||
        die "cannot create MariaDB user slurm"
    # slurmdbd reads slurmdbd.conf beside slurm.conf; it must be the SlurmUser's, mode 600.
    ( umask 077; cat >"$DIR/slurmdbd.conf" <<DBDCONF
# slurmdbd.conf of a throw-away Hearth test cluster, written by contrib/slurm-local/start.sh
AuthType=auth/munge
AuthInfo=socket=$DIR/munge/munge.socket
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
PidFile=$DIR/run/slurmdbd.pid.slurm
LogFile=$DIR/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$SQL_PORT
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
DBDCONF
    )
    if ! alive slurmdbd; then
        setsid slurmdbd -D </dev/null >>"$DIR/log/slurmdbd.out" 2>&1 &
        echo $! >"$DIR/run/slurmdbd.pid"
    fi
    # Ready once it answers a client (and has made its tables).
    ok=
    for _ in $(seq 150); do
        alive slurmdbd || die "slurmdbd exited"
        timeout 5 sacctmgr -n -P show cluster format=cluster >/dev/null 2>&1 && { ok=1; break; }
        sleep 0.1
    done
    [ -n "$ok" ] || die "slurmdbd does not answer on port $DBD_PORT"
fi

if ! alive slurmctld; then
    # A fresh start (-c): no jobs from an earlier instance come back.
    setsid slurmctld -D -c -f "$SLURM_CONF" </dev/null >>"$DIR/log/slurmctld.out" 2>&1 &
    echo $! >"$DIR/run/slurmctld.pid"
fi
for i in $(seq 1 "$NODES"); do
    mkdir -p "$DIR/spool-n$i" "$DIR/tmp-n$i"
    if ! alive "slurmd-n$i"; then
        setsid slurmd -D -N "n$i" -f "$SLURM_CONF" </dev/null >>"$DIR/log/slurmd-n$i.out" 2>&1 &
        echo $! >"$DIR/run/slurmd-n$i.pid"
    fi
done

# ---- wait until every node is up and a trivial job runs ----
ok=
for _ in $(seq 150); do
    alive slurmctld || die "slurmctld exited"
    st=$(sinfo -h -N -o '%t' 2>/dev/null | sort -u | tr '\n' ' ')
    # Up: every node idle, or running jobs (a node restarted beside busy ones).
    if [ -n "$st" ] && [ -z "$(echo "$st" | tr ' ' '\n' | grep -vxE 'idle|mix|alloc|')" ]; then
        ok=1
        break
    fi
    # A node down from an earlier life of this instance: bring it back.
    if echo "$st" | grep -qE 'down|drain'; then
        scontrol update nodename="n[1-$NODES]" state=resume >/dev/null 2>&1 || true
    fi
    sleep 0.2
done
[ -n "$ok" ] || die "nodes not up after 30 s: $(sinfo -N 2>&1)"
timeout 60 srun -N1 -n1 -t 1 true || die "srun true failed"
if [ -n "$DBD" ]; then
    # slurmctld registers the cluster with slurmdbd on its own (job records follow it by a
    # second or more: sacct lags slurmctld).
    ok=
    for _ in $(seq 150); do
        timeout 5 sacctmgr -n -P show cluster format=cluster 2>/dev/null | grep -qx "hearth$PORT" && { ok=1; break; }
        sleep 0.1
    done
    [ -n "$ok" ] || die "cluster hearth$PORT not registered with slurmdbd after 15 s"
fi

# ---- slurmrestd: JWT over TCP on 127.0.0.1, as user slurm (it refuses root) ----
if [ -n "$REST" ]; then
    write_token
    if ! alive slurmrestd; then
        # SLURM_JWT=daemon in its environment only: it then speaks to slurmctld with each
        # client's token.  openapi/v0.0.38 alone: the dbv0.0.38 plugin needs slurmdbd.
        setsid env SLURM_JWT=daemon slurmrestd -f "$SLURM_CONF" -a rest_auth/jwt \
            -s openapi/v0.0.38 -u slurm "127.0.0.1:$REST" \
            </dev/null >>"$DIR/log/slurmrestd.log" 2>&1 &
        echo $! >"$DIR/run/slurmrestd.pid"
    fi
    ok=
    for _ in $(seq 100); do
        alive slurmrestd || die "slurmrestd exited"
        rest_ping && { ok=1; break; }
        sleep 0.1
    done
    [ -n "$ok" ] || die "slurmrestd on 127.0.0.1:$REST does not answer"
    say "slurmrestd on http://127.0.0.1:$REST (JWT; token in $DIR/rest/token)"
fi
say "up in $DIR: $NODES nodes, slurmctld on port $PORT (export SLURM_CONF=$SLURM_CONF)"
