#!/usr/bin/env bash
# hearth submit with the local backend, end to end: runs complete and land in the database,
# top/query/show/compare/export read them, duplicates are detected (--force, a changed
# spec), --dry-run changes nothing, exit codes (2 for a bad spec with FILE:LINE:COL, 1 when
# a run fails), --help for every command.
set -u
cd "$(dirname "$0")/../.."
. tests/cli/lib.sh
. tests/cli/hearth_common.bash
hearth_tmp submit
make_trainer

tap_plan 25

# 3 x 2 matrix, where drops one point -> 5 points.
cat >s.yaml <<EOF
name: lr-sweep
trainer: ./trainer.sh
$TINY_BASE
matrix:
  train.lr: [1.0e-3, 2.0e-3, 3.0e-3]
  train.seed: [1, 2]
where: "not (train.lr > 0.0025 and train.seed == 2)"
EOF

run_h plan plan s.yaml --format json
plan_ok() {
    rc_is plan 0 || return 1
    [ "$(sqlite3 :memory: "select json_array_length(json_extract(readfile('$T/plan.out'), '\$.kept'))")" = 5 ] ||
        { echo "plan --format json does not keep 5 points:"; cat plan.out; return 1; }
    [ ! -e h.db ] || { echo "plan created the database"; return 1; }
}
tap_check "plan --format json: 5 kept points, no database created" plan_ok

run_h dry submit s.yaml --dry-run
dry_ok() {
    rc_is dry 0 && grep -q "5 runs .* would be created" dry.out && [ ! -e runs ] &&
        [ ! -e h.db ] && [ ! -e invocations.log ]
}
tap_check "submit --dry-run: says 5 runs, creates nothing" dry_ok

run_h sub1 submit s.yaml --backend local --jobs 2
sub1_ok() {
    rc_is sub1 0 || return 1
    [ "$(sql "select count(*) from runs where state = 'completed'")" = 5 ] ||
        { echo "runs:"; sql "select run_id, state from runs"; return 1; }
    [ "$(sql "select count(*) from results")" = 5 ] || { echo "results missing"; return 1; }
    [ "$(sql "select count(*) from metrics")" = 15 ] || { echo "metrics: want 15 rows"; return 1; }
    [ "$(wc -l <invocations.log)" = 5 ] || { echo "trainer ran $(wc -l <invocations.log) times"; return 1; }
    grep -q "5 completed, 0 failed" sub1.out || { cat sub1.out; return 1; }
}
tap_check "submit: 5 runs completed, results and metrics in the database" sub1_ok

files_ok() {
    local d
    for d in runs/lr-sweep/lr-sweep-{1..5}; do
        for f in run.yaml job.sh job.json exit_code stdout.log stderr.log metrics.jsonl result.json; do
            [ -e "$d/$f" ] || { echo "$d/$f missing"; return 1; }
        done
        [ "$(cat "$d/exit_code")" = 0 ] || { echo "$d/exit_code"; return 1; }
        [ -x "$d/job.sh" ] || { echo "$d/job.sh not executable"; return 1; }
    done
    # run.yaml reads back to the run's config hash: the trainer's result says so.
    [ "$(sql "select count(*) from runs r join results x on x.run = r.id")" = 5 ]
    grep -q "$(sql "select config_hash from runs where run_id = 'lr-sweep-3'")" runs/lr-sweep/lr-sweep-3/result.json
}
tap_check "run directories: run.yaml, job.sh, exit_code, logs, trainer outputs" files_ok

progress_ok() { grep -q '^\[5/5\] running 0 · done 5 · failed 0$' sub1.err || { cat sub1.err; return 1; }; }
tap_check "progress lines on stderr ([N/T] running · done · failed)" progress_ok

run_h top top lr-sweep
top_ok() {
    rc_is top 0 || return 1
    [ "$(grep -c '^lr-sweep-' top.out)" = 5 ] || { cat top.out; return 1; }
    # best first: tokens_per_s descending
    local first; first=$(sql "select r.run_id from runs r join results x on x.run = r.id order by x.tokens_per_s desc limit 1")
    [ "$(grep -m1 '^lr-sweep-' top.out | cut -d' ' -f1)" = "$first" ] || { echo "want $first first"; cat top.out; return 1; }
}
tap_check "top: the 5 runs, best tokens/s first" top_ok

run_h sub2 submit s.yaml
tap_check "same spec again: nothing runs" bash -c "[ \"\$(cat '$T/sub2.rc')\" = 0 ] && [ \"\$(wc -l <'$T/invocations.log')\" = 5 ] && [ \"\$(sqlite3 -cmd '.timeout 10000' '$T/h.db' 'select count(*) from runs')\" = 5 ] && grep -q '0 new runs' '$T/sub2.err'"

run_h sub3 submit s.yaml --force
force_ok() {
    rc_is sub3 0 && [ "$(wc -l <invocations.log)" = 10 ] &&
        [ "$(sql "select count(*) from runs where state = 'completed'")" = 10 ]
}
tap_check "--force: every point runs again" force_ok

# A changed spec: one more lr value -> 2 more points, the old ones are skipped.
sed -i 's/\[1.0e-3, 2.0e-3, 3.0e-3\]/[1.0e-3, 2.0e-3, 3.0e-3, 5.0e-4]/' s.yaml
run_h sub4 submit s.yaml
changed_ok() {
    rc_is sub4 0 && [ "$(wc -l <invocations.log)" = 12 ] &&
        [ "$(sql "select count(*) from runs")" = 12 ] &&
        [ "$(sql "select count(*) from run_config_kv k join config_keys c on c.id = k.key_id where c.key = 'train.lr' and k.num = 0.0005")" = 2 ]
}
tap_check "changed spec: only its 2 new points run" changed_ok

# Query: filter, order, columns, limit and each format, checked against SQL.
run_h q1 query 'train.lr >= 0.002 and train.seed == 1' --experiment lr-sweep --columns run_id,train.lr,train.seed,final_loss --format csv
q1_ok() {
    rc_is q1 0 || return 1
    [ "$(head -1 q1.out)" = "run_id,train.lr,train.seed,final_loss" ] || { cat q1.out; return 1; }
    # lr 2e-3 and 3e-3 with seed 1, each run twice (--force) -> 4 rows
    [ "$(tail -n +2 q1.out | wc -l)" = 4 ] || { cat q1.out; return 1; }
    ! tail -n +2 q1.out | cut -d, -f3 | grep -qv '^1$'
}
tap_check "query FILTER --columns --format csv: header and matching rows" q1_ok

run_h q2 query 'final_loss > 0' --order -final_loss --limit 3 --columns run_id,final_loss --format csv
q2_ok() {
    rc_is q2 0 || return 1
    local want; want=$(sql "select r.run_id from runs r join results x on x.run = r.id order by x.final_loss desc, r.id limit 3")
    [ "$(tail -n +2 q2.out | cut -d, -f1)" = "$want" ] || { echo "want $want"; cat q2.out; return 1; }
}
tap_check "query --order -KEY --limit: the same rows as SQL" q2_ok

run_h q3 query 'train.seed == 2' --format json --columns run_id,train.seed
q3_ok() {
    rc_is q3 0 || return 1
    [ "$(sqlite3 :memory: "select json_valid(readfile('$T/q3.out')), json_array_length(readfile('$T/q3.out'))")" = "1|$(sql "select count(*) from run_config_kv k join config_keys c on c.id = k.key_id where c.key = 'train.seed' and k.num = 2")" ] || { cat q3.out; return 1; }
}
tap_check "query --format json: valid JSON, one object per matching run" q3_ok

run_h q4 query --order run_id --limit 2 --format table
tap_check "query --format table: header, rule, rows" bash -c "[ \"\$(cat '$T/q4.rc')\" = 0 ] && sed -n 2p '$T/q4.out' | grep -q '^---' && [ \"\$(wc -l <'$T/q4.out')\" = 4 ]"

run_h q5 query 'train.lr >'
tap_check "query with a bad filter: exit 2 with the column" bash -c "[ \"\$(cat '$T/q5.rc')\" = 2 ] && grep -q 'filter:1:' '$T/q5.err'"

run_h show show lr-sweep-1
run_h cmp compare lr-sweep-1 lr-sweep-2 --format csv
run_h exp export lr-sweep --format csv
show_ok() {
    rc_is show 0 && grep -q 'final_loss' show.out && rc_is cmp 0 && grep -q 'train.seed' cmp.out &&
        rc_is exp 0 && [ "$(tail -n +2 exp.out | wc -l)" = 12 ]
}
tap_check "show, compare, export" show_ok

run_h st status
run_h st2 status lr-sweep --format csv
status_ok() {
    rc_is st 0 && grep -Eq '^lr-sweep +12 +0 +0 +0 +0 +12 ' st.out && rc_is st2 0 &&
        [ "$(grep -c ',completed,' st2.out)" = 12 ]
}
tap_check "status: per experiment and per run" status_ok

# A bad spec: exit 2 and FILE:LINE:COL.
printf 'name: bad\nbase: {model: tiny-vlm}\nmatrx:\n  train.lr: [1]\n' >bad.yaml
run_h bad submit bad.yaml
tap_check "bad spec: exit 2, FILE:LINE:COL message" bash -c "[ \"\$(cat '$T/bad.rc')\" = 2 ] && grep -q 'bad.yaml:3:1: matrx' '$T/bad.err'"

printf 'name: bad2\nbase: {model: tiny-vlm}\nwhere: "train.lr >"\n' >bad2.yaml
run_h bad2 plan bad2.yaml
tap_check "bad where expression: exit 2, FILE:LINE:COL" bash -c "[ \"\$(cat '$T/bad2.rc')\" = 2 ] && grep -Eq 'bad2.yaml:3:[0-9]+: where' '$T/bad2.err'"

# Files that never end: refused by kind, named (under a timeout: the spec reader once read
# /dev/zero up to 64 MiB, the preset reader until memory ran out).
zero_ok() {
    timeout 60 "$HEARTH_ABS" --db "$T/h.db" plan /dev/zero >zs.out 2>zs.err
    echo $? >zs.rc
    rc_is zs 2 && grep -q '/dev/zero: not a regular file (a character device)' zs.err || return 1
    printf 'name: zm\nbase: {model: tiny-vlm}\nmatrix:\n  model: [tiny-vlm, /dev/zero]\n' >zm.yaml
    timeout 60 "$HEARTH_ABS" --db "$T/h.db" plan zm.yaml >zm.out 2>zm.err
    echo $? >zm.rc
    rc_is zm 2 && grep -q 'zm.yaml:4:21: model: /dev/zero: not a regular file' zm.err ||
        { cat zm.out zm.err; return 1; }
}
tap_check "a spec or a swept model that is /dev/zero: exit 2, the path named" zero_ok

# Matrices too large to plan: refused from the list lengths before any point is made
# (under a timeout: 10^9 points once ran minutes into "out of memory", 2^40 points whose
# where keeps nothing never ended).
huge_ok() {
    local k vals16 keys="train.seed train.steps train.warmup train.micro_batch train.global_batch
        train.seq_len train.checkpoint_every data.images_min data.images_max train.measure_from"
    printf 'name: huge\n%s\nmatrix:\n' "$TINY_BASE" >h9.yaml
    for k in $(echo $keys | cut -d' ' -f1-9); do echo "  $k: [$(seq -s, 1 10)]" >>h9.yaml; done
    timeout 60 "$HEARTH_ABS" --db "$T/h.db" plan h9.yaml >h9.out 2>h9.err
    echo $? >h9.rc
    rc_is h9 2 && grep -q 'h9.yaml: matrix: 1000000000 candidate points (10 x 10 x 10 x 10 x 10 x 10 x 10 x 10 x 10), more than max_points 100000: .*max_points: N' h9.err ||
        { cat h9.err; return 1; }
    printf 'name: huge40\n%s\nwhere: "false"\nmatrix:\n' "$TINY_BASE" >h40.yaml
    vals16=$(seq -s, 1 16)
    for k in $keys; do echo "  $k: [$vals16]" >>h40.yaml; done
    timeout 60 "$HEARTH_ABS" --db "$T/h.db" submit h40.yaml >h40.out 2>h40.err
    echo $? >h40.rc
    rc_is h40 2 && grep -q 'h40.yaml: matrix: 1099511627776 candidate points (16 x .*more than max_points 100000' h40.err ||
        { cat h40.err; return 1; }
    [ ! -e runs/huge40 ] || { echo "submit made runs"; return 1; }
}
tap_check "10^9 and 2^40 (where: false) points: refused (exit 2) with the count and max_points" huge_ok

# A run that fails: exit 1, state failed with its exit code.
cat >f.yaml <<EOF
name: fails
trainer: ./trainer.sh
$TINY_BASE
EOF
echo 7 >fail
run_h fail submit f.yaml
rm -f fail
fail_ok() {
    rc_is fail 1 && [ "$(sql "select state, exit_code from runs where run_id = 'fails-1'")" = "failed|7" ] &&
        grep -q 'fails-1 failed' fail.err
}
tap_check "a failing run: exit 1, state failed, exit code recorded" fail_ok

help_ok() {
    local c
    for c in plan submit status wait cancel resume logs query show compare top export; do
        "$HEARTH_ABS" "$c" --help >"$T/help.out" 2>&1 || { echo "$c --help failed"; return 1; }
        grep -q "^usage: hearth $c" "$T/help.out" || { echo "$c --help:"; cat "$T/help.out"; return 1; }
    done
    "$HEARTH_ABS" --help | grep -q '^  submit SPEC'
}
tap_check "--help for hearth and every command" help_ok

usage_ok() {
    "$HEARTH_ABS" frobnicate >/dev/null 2>&1; [ $? = 2 ] || return 1
    "$HEARTH_ABS" submit >/dev/null 2>&1; [ $? = 2 ] || return 1
    "$HEARTH_ABS" submit s.yaml --jobs 0 >/dev/null 2>&1; [ $? = 2 ] || return 1
    "$HEARTH_ABS" query --format xml >/dev/null 2>&1; [ $? = 2 ] || return 1
    "$HEARTH_ABS" submit s.yaml --backend nosuch >/dev/null 2>&1; [ $? = 2 ] || return 1
    "$HEARTH_ABS" --db "$T/none.db" top x >/dev/null 2>&1; [ $? = 2 ] || return 1
}
tap_check "usage errors: exit 2" usage_ok

# --db precedence: $HEARTH_DB when no --db; runs/ beside the database.
mkdir -p envdb
HEARTH_DB="$T/envdb/e.db" "$HEARTH_ABS" submit f.yaml >envdb.out 2>&1
tap_check "\$HEARTH_DB names the database; runs/ beside it" bash -c "[ -f '$T/envdb/e.db' ] && [ -f '$T/envdb/runs/fails/fails-1/exit_code' ]"

# Files keep the user's umask: under umask 077 the run's files are the owner's alone, and
# the job script stays executable by its owner.
mkdir -p umaskdb
(umask 077; HEARTH_DB="$T/umaskdb/u.db" "$HEARTH_ABS" submit f.yaml >umask.out 2>&1)
umask_ok() {
    local d=$T/umaskdb/runs/fails/fails-1
    [ "$(stat -c %a "$d/run.yaml")" = 600 ] || { echo "run.yaml $(stat -c %a "$d/run.yaml")"; return 1; }
    [ "$(stat -c %a "$d/job.json")" = 600 ] || { echo "job.json $(stat -c %a "$d/job.json")"; return 1; }
    [ "$(stat -c %a "$d/job.sh")" = 700 ] || { echo "job.sh $(stat -c %a "$d/job.sh")"; return 1; }
    [ -f "$d/exit_code" ] || { echo "the job did not run"; cat umask.out; return 1; }
}
tap_check "umask 077: run.yaml and job.json 0600, job.sh 0700, the job runs" umask_ok
