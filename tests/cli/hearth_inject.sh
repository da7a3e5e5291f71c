#!/usr/bin/env bash
# Injection attempts are inert.  Shell: metacharacters in every value that reaches a job
# script (the trainer path, the working directory, the runs directory) and in config values
# (data.path) run nothing, and the job script holds each value single-quoted.  SQL: filters,
# column lists, orders, --by keys, run and experiment names with SQL in them change nothing
# in the database.
set -u
cd "$(dirname "$0")/../.."
. tests/cli/lib.sh
. tests/cli/hearth_common.bash
hearth_tmp inject
make_trainer

tap_plan 7

# A directory name with shell metacharacters that would run commands if a job script used
# it unquoted (no single quote here, so that such a script would not stop at a syntax
# error first; the trainer's name below has the quotes).
NASTY='we ird "dir" $(touch pwned1) ;touch pwned2; `touch pwned3` $HOME \ *'
RUNS_PART='r & $(touch pwned4) | cat'
mkdir "$T/$NASTY" "$T/$NASTY/$RUNS_PART" || exit 1
TRAINER_NAME='tr $(touch pwned5) '\''q'\'' `touch pwned6`.sh'
cp trainer.sh "$T/$NASTY/$TRAINER_NAME"
cd "$T/$NASTY" || exit 1
RUNS="$T/$NASTY/$RUNS_PART"

# In YAML single quotes, ' is written ''.
yq() { printf "'%s'" "$(printf '%s' "$1" | sed "s/'/''/g")"; }
DATA_PATH='$(touch pwned7); rm -rf "$HOME"/nothing; `touch pwned8` '\'' ; DROP TABLE runs; --'
cat >s.yaml <<EOF
name: inject
trainer: $(yq "./$TRAINER_NAME")
$TINY_BASE
matrix:
  data.path: [$(yq "$DATA_PATH"), plain]
EOF

"$HEARTH_ABS" --db "$T/h.db" --runs-dir "$RUNS" submit s.yaml >"$T/sub.out" 2>"$T/sub.err"
sub_rc=$?
cd "$T" || exit 1
RUNDIR="$RUNS/inject/inject-1"

tap_check "submit from a directory full of shell metacharacters: both runs complete" bash -c "[ $sub_rc = 0 ] && [ \"\$(sqlite3 -cmd '.timeout 10000' '$T/h.db' \"select count(*) from runs where state = 'completed'\")\" = 2 ] || { cat '$T/sub.err'; exit 1; }"

pwned_ok() {
    local found; found=$(find "$T" -name 'pwned*' 2>/dev/null)
    [ -z "$found" ] || { echo "injected commands ran: $found"; return 1; }
}
tap_check "no injected command ran (no pwned* file anywhere)" pwned_ok

# quoted VALUE: the single-quoted shell word for VALUE.
quoted() { printf "'%s'" "$(printf '%s' "$1" | sed "s/'/'\\\\''/g")"; }
script_ok() {
    local s="$RUNDIR/job.sh"
    [ -f "$s" ] || { echo "no $s"; return 1; }
    grep -qxF "TRAINER=$(quoted "$T/$NASTY/$TRAINER_NAME")" "$s" || { echo "TRAINER not quoted:"; grep '^TRAINER=' "$s"; return 1; }
    grep -qxF "WORKDIR=$(quoted "$T/$NASTY")" "$s" || { echo "WORKDIR not quoted:"; grep '^WORKDIR=' "$s"; return 1; }
    grep -qxF "RUN_DIR=$(quoted "$RUNDIR")" "$s" || { echo "RUN_DIR not quoted:"; grep '^RUN_DIR=' "$s"; return 1; }
    bash -n "$s" || return 1
}
tap_check "the job script holds every value as one single-quoted word" script_ok

config_ok() {
    # The value went into the run config unchanged (as data, never into a script).
    [ "$(sqlite3 -cmd '.timeout 10000' "$T/h.db" "select json_extract(config_json, '\$.data.path') from runs where run_id = 'inject-1'")" = "$DATA_PATH" ] || return 1
    ! grep -qF 'pwned7' "$RUNDIR/job.sh"
}
tap_check "a config value with shell and SQL in it is stored as data, not in the script" config_ok

# ---- SQL ----
snapshot() { sqlite3 -cmd '.timeout 10000' "$T/h.db" "select count(*) from runs; select count(*) from results; select count(*) from run_config_kv; select group_concat(name) from (select name from sqlite_master order by name); pragma integrity_check;"; }
before=$(snapshot)
bad=0
try() {   # try WANT ARGS...: hearth must exit with a status in WANT ("0", "2", "0|2")
    local want=$1; shift
    "$HEARTH_ABS" --db "$T/h.db" "$@" >"$T/try.out" 2>"$T/try.err"
    local rc=$?
    if ! [[ "|$want|" == *"|$rc|"* ]]; then
        echo "hearth $*: exit $rc, want $want"; cat "$T/try.err"; bad=1
    fi
}
try "0|2" query "run_id == 'x'' OR 1=1; DROP TABLE runs; --'"
[ "$(wc -l <"$T/try.out")" -le 2 ] || { echo "a quote in a string literal matched rows"; bad=1; }
try 0 query "data.path == '$(printf '%s' "$DATA_PATH" | sed "s/'/\\\\'/g")'" --columns run_id --format csv
[ "$(tail -n +2 "$T/try.out")" = inject-1 ] || { echo "the value with SQL in it did not match itself exactly:"; cat "$T/try.out" "$T/try.err"; bad=1; }
try 2 query --columns "run_id, final_loss FROM runs; DROP TABLE runs; --"
try 2 query --order "-final_loss; DROP TABLE runs"
try 2 query "\"x'); DROP TABLE runs; --\" > 1 or train.lr' > 0"
try 2 query "train.lr; DROP TABLE runs > 0"
try 2 top inject --by "tokens_per_s; DROP TABLE runs"
try 2 top inject --columns "run_id; DELETE FROM results"
try "0|2" show "inject-1'; DROP TABLE runs; --"
try "0|2" export "inject' OR '1'='1"
try "0|2" compare "inject-1" "x\" OR 1=1 --"
try "0|2" status "inject'; DELETE FROM runs; --"
try "0|2" cancel "inject'; DELETE FROM runs; --"
tap_check "SQL in filters, columns, orders, --by and names: refused or matched literally" test "$bad" = 0
after=$(snapshot)
tap_check "the database is intact after every attempt" test "$before" = "$after"

# Names with SQL or shell in them are refused where a name is defined.
printf 'name: "x; DROP TABLE runs"\nbase: {model: tiny-vlm}\n' >badname.yaml
"$HEARTH_ABS" --db "$T/h.db" submit badname.yaml >/dev/null 2>"$T/badname.err"
bn_rc=$?
tap_check "an experiment name with metacharacters: exit 2, FILE:LINE:COL" bash -c "[ $bn_rc = 2 ] && grep -q 'badname.yaml:1:7: name' '$T/badname.err'"
