#!/usr/bin/env bash
# How the end of a local run is recorded from what its job left in the run directory:
# a trainer that exits 0 without writing result.json failed (and status and show say so).
set -u
cd "$(dirname "$0")/../.."
. tests/cli/lib.sh
. tests/cli/hearth_common.bash
hearth_tmp finish
make_trainer

tap_plan 2

run_is() {   # run_is RUN STATE|EXIT_CODE
    local got; got=$(sql "select state || '|' || ifnull(exit_code, '-') from runs where run_id = '$1'")
    [ "$got" = "$2" ] || { echo "$1: $got, want $2"; sql "select run_id, state, exit_code from runs"; return 1; }
}

# ---- exit 0, nothing written ----
printf 'name: empty\ntrainer: ./trainer.sh\n%s\n' "$TINY_BASE" >e.yaml
echo 0 >fail
run_h e submit e.yaml
rm -f fail
run_h est status empty
run_h esh show empty-1
empty_ok() {
    rc_is e 1 && run_is empty-1 'failed|0' || return 1
    grep -q 'empty-1 failed: exit 0 but no result.json' e.err || { cat e.err; return 1; }
}
tap_check "exit 0 without result.json or metrics: failed 'exit 0 but no result.json', submit exits 1" empty_ok
shown_ok() {
    rc_is est 0 && rc_is esh 0 || return 1
    grep -Eq '^empty-1 +failed +1 +0 ' est.out || { cat est.out; return 1; }
    grep -Eq 'running -> failed .*exit 0\): exit 0 but no result.json' esh.out || { cat esh.out; return 1; }
}
tap_check "status lists it failed (exit code 0); show gives the reason" shown_ok
