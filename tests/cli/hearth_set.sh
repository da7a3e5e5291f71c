#!/usr/bin/env bash
# The first minutes with hearth: `--set KEY=VALUE` on plan and submit (a base key, a
# resource and a matrix entry change the plan; a bad one names the argument; the experiment
# records the spec with the overrides applied), did-you-mean for a misspelt command and
# preset, shell completion of experiment and run names from the database, and the end of
# `make demo` saying where its database is.
set -u
cd "$(dirname "$0")/../.."
. tests/cli/lib.sh
. tests/cli/hearth_common.bash
MAKEFILE="$ROOT/Makefile"
hearth_tmp set
make_trainer

tap_plan 8

cat >s.yaml <<EOF
name: over
trainer: ./trainer.sh
$TINY_BASE
resources:
  cpus_per_task: 1
matrix:
  train.seed: [1, 2]
EOF

# jq-free reads of the plan's JSON: sqlite's json functions.
pj() { sqlite3 :memory: "select $1 from (select readfile('$T/$2') as j)"; }

run_h p0 plan s.yaml --format json
run_h p1 plan s.yaml --format json --set train.steps=2 --set resources.cpus_per_task=2 \
    --set 'matrix.train.lr=[1e-3, 3e-3]' --set train.steps=4
plan_ok() {
    rc_is p0 0 && rc_is p1 0 || return 1
    [ "$(pj "json_extract(j, '\$.counts.kept')" p0.out)" = 2 ] || { cat p0.out; return 1; }
    # the matrix override adds an axis: 2 seeds x 2 learning rates
    [ "$(pj "json_extract(j, '\$.counts.kept')" p1.out)" = 4 ] || { cat p1.out; return 1; }
    [ "$(pj "json_extract(j, '\$.kept[3].overrides.\"train.lr\"')" p1.out)" = 0.003 ] ||
        { echo "train.lr not swept"; cat p1.out; return 1; }
    [ "$(pj "json_extract(j, '\$.kept[0].resources.cpus_per_task')" p1.out)" = 2 ] ||
        { echo "resources.cpus_per_task not overridden"; return 1; }
    # the base key changes every point's config (the last --set train.steps wins)
    local h0 h1
    h0=$(pj "json_extract(j, '\$.kept[0].hash')" p0.out)
    h1=$(pj "json_extract(j, '\$.kept[0].hash')" p1.out)
    [ -n "$h0" ] && [ "$h0" != "$h1" ] || { echo "train.steps did not change the hash"; return 1; }
}
tap_check "plan --set: a base key, a resource and a matrix entry change the plan" plan_ok

run_h bad1 plan s.yaml --set 'matrix.train.lr=1e-3'
run_h bad2 submit s.yaml --set trian.lr=1 --backend local
run_h bad3 plan s.yaml --set train.lr=fast
bad_ok() {
    rc_is bad1 2 && rc_is bad2 2 && rc_is bad3 2 || return 1
    grep -qF 'hearth plan: --set matrix.train.lr: expected a non-empty list of values in matrix, got "1e-3"' bad1.err ||
        { cat bad1.err; return 1; }
    grep -qF "hearth submit: --set trian.lr: unknown key (did you mean 'train.lr'?)" bad2.err ||
        { cat bad2.err; return 1; }
    grep -qF 'hearth plan: --set train.lr: expected a number' bad3.err || { cat bad3.err; return 1; }
    [ ! -e h.db ] || { echo "a bad --set created the database"; return 1; }
}
tap_check "a bad --set names the argument (exit 2), nothing created" bad_ok

run_h sub submit s.yaml --backend local --jobs 2 --set 'matrix.train.seed=[5]' --set train.steps=2
recorded_ok() {
    rc_is sub 0 || return 1
    [ "$(sql "select count(*) from runs where state = 'completed'")" = 1 ] || return 1
    local text; text=$(sql "select spec_text from experiments where name = 'over'")
    grep -qF -- "--set matrix.train.seed=[5] --set train.steps=2" <<<"$text" &&
        grep -qE '^  train.seed: \[5\]$' <<<"$text" && grep -qE '^    steps: 2$' <<<"$text" ||
        { echo "recorded spec:"; echo "$text"; return 1; }
    # the recorded spec plans the same point: nothing left to run
    sql "select spec_text from experiments where name = 'over'" >recorded.yaml
    run_h again plan recorded.yaml --format json
    rc_is again 0 && [ "$(pj "json_extract(j, '\$.counts.skipped')" again.out)" = 1 ] ||
        { cat again.out; return 1; }
}
tap_check "submit --set records the spec with the overrides; it plans the same point" recorded_ok

run_h typo stauts
typo_ok() {
    rc_is typo 2 && grep -qF "hearth: unknown command 'stauts' (did you mean 'status'?)" typo.err ||
        { cat typo.err; return 1; }
}
tap_check "hearth stauts: did you mean 'status'?" typo_ok

sed 's/model: tiny-vlm/model: tiny-vlmm/' s.yaml >typo.yaml
run_h preset plan typo.yaml
run_h preset2 plan s.yaml --set model=tiny-vlmm
preset_ok() {
    rc_is preset 2 && rc_is preset2 2 || return 1
    grep -q "typo.yaml:4:10: model: preset \"tiny-vlmm\" not found (searched: .*); did you mean 'tiny-vlm'?" preset.err ||
        { cat preset.err; return 1; }
    grep -q "^hearth plan: --set model: preset \"tiny-vlmm\" not found .*did you mean 'tiny-vlm'?" preset2.err ||
        { cat preset2.err; return 1; }
}
tap_check "a misspelt preset (file or --set): did you mean 'tiny-vlm'?" preset_ok

"$HEARTH_ABS" completion bash >c.bash
comp() {
    bash -c '. ./c.bash; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); _hearth; printf "%s\n" "${COMPREPLY[@]}"' \
        _ "$@"
}
complete_ok() {
    [ "$(h completion experiments)" = over ] || { echo "completion experiments:"; h completion experiments; return 1; }
    [ "$(h completion runs)" = over-1 ] || { h completion runs; return 1; }
    [ "$(comp "$HEARTH_ABS" --db "$T/h.db" status o)" = over ] || { echo "status o<TAB>"; return 1; }
    [ "$(comp "$HEARTH_ABS" --db="$T/h.db" show ov)" = over-1 ] || { echo "show ov<TAB>"; return 1; }
    [ "$(HEARTH_DB="$T/h.db" comp "$HEARTH_ABS" top '')" = over ] || { echo "HEARTH_DB top <TAB>"; return 1; }
    [ "$(comp "$HEARTH_ABS" --db "$T/h.db" query --experiment '')" = over ] ||
        { echo "query --experiment <TAB>"; return 1; }
    # without a database: no names and no error on the terminal
    [ -z "$(comp "$HEARTH_ABS" --db "$T/none.db" status '' 2>&1)" ] || { echo "noise without a db"; return 1; }
}
tap_check "completion offers experiment and run names from the database" complete_ok

no_db_ok() {
    run_h nodb --db "$T/elsewhere.db" status over
    rc_is nodb 2 && grep -qF "elsewhere.db: no such database" nodb.err &&
        grep -qF -- '--db FILE or $HEARTH_DB' nodb.err || { cat nodb.err; return 1; }
}
tap_check "status on a missing database says how to name another" no_db_ok

# make demo ends by naming its database and the commands that read it (read from the
# Makefile's recipe rather than run: the demo installs packages and trains for minutes).
demo_ok() {
    local recipe; recipe=$(make -s -n -f "$MAKEFILE" -C "$ROOT" demo BUILD=build MAKE=true 2>/dev/null)
    grep -qF 'results in build/demo/hearth.db' <<<"$recipe" &&
        grep -qF 'export HEARTH_DB=build/demo/hearth.db' <<<"$recipe" &&
        grep -qF 'build/bin/hearth status demo' <<<"$recipe" &&
        grep -qF -- '--db build/demo/hearth.db' <<<"$recipe" &&
        grep -qF 'demo:final_loss' <<<"$recipe" || { echo "$recipe"; return 1; }
    grep -qF 'export HEARTH_DB=build/demo/hearth.db' "$ROOT/README.md" ||
        { echo "README does not name the demo's database"; return 1; }
}
tap_check "make demo names its database and what to run next (README too)" demo_ok
