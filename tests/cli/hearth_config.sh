#!/usr/bin/env bash
# hearth config show and the config file ($XDG_CONFIG_HOME/hearth/config.yaml): values and
# their sources, precedence command line > environment > file > built-in, the file's db
# and slurm defaults reach the commands (a submit writes the partition into job.json
# unless the spec says), errors name FILE:LINE:COL and the key (exit 2), and --help and
# --version work even with a broken file.
set -u
cd "$(dirname "$0")/../.."
. tests/cli/lib.sh
. tests/cli/hearth_common.bash
hearth_tmp config
make_trainer

tap_plan 8
CFG="$XDG_CONFIG_HOME/hearth/config.yaml"
mkdir -p "$(dirname "$CFG")"

# hc ARGS...: hearth without --db (so the config decides), output in $T/hc.{out,err,rc}.
hc() { "$HEARTH_ABS" "$@" >"$T/hc.out" 2>"$T/hc.err"; echo $? >"$T/hc.rc"; }

hc config show
builtin_ok() {
    rc_is hc 0 || return 1
    grep -qE '^db +hearth\.db +built-in +HEARTH_DB' hc.out &&
        grep -qE '^backend +local +built-in' hc.out &&
        grep -qE '^slurm\.partition +- +unset' hc.out &&
        grep -q "config file: $CFG (not found)" hc.out || { cat hc.out; return 1; }
}
tap_check "no config file: the built-in defaults" builtin_ok

cat >"$CFG" <<EOF
# defaults for hearth
db: $T/from-file.db
backend: local
slurm:
  partition: gpu-part
  account: proj42
slurmrest:
  url: http://head:6820
EOF
hc config show --format json
file_ok() {
    rc_is hc 0 || return 1
    local got
    got=$(python3 -c '
import json, sys
rows = {r["key"]: r for r in json.load(open(sys.argv[1]))}
print(rows["db"]["value"], rows["db"]["source"], rows["slurm.partition"]["value"],
      rows["slurm.partition"]["source"], rows["slurmrest.url"]["value"], rows["slurm.qos"]["value"])
' hc.out) || return 1
    [ "$got" = "$T/from-file.db $CFG:2:5 gpu-part $CFG:5:14 http://head:6820 None" ] ||
        { echo "got: $got"; return 1; }
}
tap_check "config show: the file's values with FILE:LINE:COL" file_ok

HEARTH_DB="$T/from-env.db" HEARTH_SLURM_PARTITION=env-part hc --db "$T/from-cmd.db" config show
prec_ok() {
    rc_is hc 0 || return 1
    grep -qE "^db +$T/from-cmd\.db +command line \(--db\)" hc.out &&
        grep -qE '^slurm\.partition +env-part +environment \(\$HEARTH_SLURM_PARTITION\)' hc.out &&
        grep -qE "^slurm\.account +proj42 +$CFG:6:12" hc.out || { cat hc.out; return 1; }
    HEARTH_DB="$T/from-env.db" hc config show
    grep -qE "^db +$T/from-env\.db +environment \(\\\$HEARTH_DB\)" hc.out || { cat hc.out; return 1; }
}
tap_check "precedence: command line > environment > file" prec_ok

cat >s.yaml <<EOF
name: cfg
trainer: ./trainer.sh
$TINY_BASE
matrix:
  train.lr: [1.0e-3]
EOF
cat >s2.yaml <<EOF
name: cfg2
trainer: ./trainer.sh
$TINY_BASE
resources: {partition: spec-part}
EOF
hc submit s.yaml
use_ok() {
    rc_is hc 0 || return 1
    [ -f from-file.db ] || { echo "the file's db was not used"; ls; return 1; }
    [ "$(sqlite3 from-file.db "select count(*) from runs where state = 'completed'")" = 1 ] || return 1
    grep -q '"partition": *"gpu-part"' runs/cfg/cfg-1/job.json &&
        grep -q '"account": *"proj42"' runs/cfg/cfg-1/job.json || { cat runs/cfg/cfg-1/job.json; return 1; }
    hc submit s2.yaml
    rc_is hc 0 && grep -q '"partition": *"spec-part"' runs/cfg2/cfg2-1/job.json ||
        { cat runs/cfg2/cfg2-1/job.json; return 1; }
}
tap_check "the file's db and slurm defaults reach submit; the spec's resources win" use_ok

HEARTH_BACKEND=nope hc config show
envbad_ok() { rc_is hc 2 && grep -q "\$HEARTH_BACKEND: backend: expected one of local|slurm|slurmrest" hc.err; }
tap_check "a bad environment value: exit 2, named" envbad_ok

printf 'db: x.db\nslurm:\n  partiton: gpu\n' >"$CFG"
hc status
unknown_ok() {
    rc_is hc 2 && grep -qF "$CFG:3:3: slurm.partiton: unknown key (did you mean 'slurm.partition'?)" hc.err
}
tap_check "unknown key: FILE:LINE:COL, the key and a hint, exit 2" unknown_ok

printf 'backend:\n  - local\n' >"$CFG"
hc config show
type_ok() { rc_is hc 2 && grep -qF "$CFG:2:3: backend: expected a string, got a list" hc.err; }
tap_check "wrong type: FILE:LINE:COL, exit 2" type_ok

helpver_ok() {
    "$HEARTH_ABS" --help >/dev/null && "$HEARTH_ABS" config --help >/dev/null &&
        "$HEARTH_ABS" --version | grep -q '^hearth '
}
tap_check "--help and --version work with a broken config file" helpver_ok
