#!/usr/bin/env bash
# Experiments as things a user manages: `status` without EXP lists them (counts per state,
# tags, creation time, runner); tag/untag and `status --tag`; archive/unarchive hide and
# show an experiment in `status` and `query` listings while commands naming it still work;
# `rm` removes one with its runs (run directories only with --delete-runs; `ingest` brings
# them back when they stay), refuses while a runner works or jobs are alive (--force
# cancels the jobs), and changes nothing when it fails; a cancelled run is counted as
# cancelled, not failed, in the progress lines of submit and wait.
set -u
cd "$(dirname "$0")/../.."
. tests/cli/lib.sh
. tests/cli/hearth_common.bash
hearth_tmp manage
make_trainer

tap_plan 14

exp_count() { sql "select count(*) from experiments where name = '$1'"; }
run_count() { sql "select count(*) from runs where run_id like '$1-%'"; }
spec() {   # spec NAME SEEDS...: a sweep of tiny runs over train.seed
    local name=$1; shift
    local seeds; seeds=$(IFS=,; echo "$*")
    cat >"$name.yaml" <<EOF
name: $name
trainer: ./trainer.sh
$TINY_BASE
matrix:
  train.seed: [$seeds]
EOF
}

spec alpha 1 2
spec beta 3
run_h sa submit alpha.yaml
run_h sb submit beta.yaml

# ---- status: one line per experiment ----
run_h st status
run_h stc status --format csv
list_ok() {
    rc_is sa 0 && rc_is sb 0 && rc_is st 0 && rc_is stc 0 || return 1
    grep -Eq '^alpha +2 +0 +0 +0 +0 +2 +0 +0 +0 ' st.out && grep -Eq '^beta +1 ' st.out ||
        { cat st.out; return 1; }
    [ "$(head -1 stc.out)" = "experiment,runs,pending,submitted,running,requeued,completed,failed,cancelled,timeout,tags,created,runner" ] ||
        { head -1 stc.out; return 1; }
    grep -Eq '^alpha,2,0,0,0,0,2,0,0,0,,20[0-9-]+T[0-9:.]+Z,$' stc.out || { cat stc.out; return 1; }
}
tap_check "status without EXP: every experiment, runs per state, tags, created, runner" list_ok

# ---- tags ----
run_h t1 tag alpha nightly v1
run_h t2 tag alpha nightly
run_h t3 tag alpha 'bad tag' good
run_h t4 untag alpha v1 never
run_h stt status --tag nightly --format csv
run_h stt2 status --tag v1
tags_ok() {
    rc_is t1 0 && grep -qx 'alpha: tagged nightly' t1.out && grep -qx 'alpha: tagged v1' t1.out || return 1
    rc_is t2 0 && grep -qx 'alpha: already tagged nightly' t2.out || return 1
    rc_is t3 2 && grep -q "tag 'bad tag'" t3.err || return 1
    [ "$(sql "select count(*) from experiment_tags where tag = 'good'")" = 0 ] || { echo "half tagged"; return 1; }
    rc_is t4 0 && grep -qx 'alpha: untagged v1' t4.out && grep -qx 'alpha: not tagged never' t4.out || return 1
    rc_is stt 0 && grep -q '^alpha,2,.*,nightly,' stt.out && ! grep -q '^beta' stt.out || { cat stt.out; return 1; }
    rc_is stt2 0 && [ "$(wc -l <stt2.out)" = 2 ] || { cat stt2.out; return 1; }   # header and rule only
}
tap_check "tag/untag: idempotent, checked names (exit 2, nothing changed), status --tag filters" tags_ok

# ---- archive ----
run_h a1 archive beta
run_h a2 archive beta
run_h ast status
run_h asta status --all --format csv
run_h aq query --format csv
run_h aqa query --all --format csv
run_h aqe query -e beta --format csv
run_h atop top beta
run_h asb status beta
run_h abad status beta --all
archive_ok() {
    rc_is a1 0 && grep -qx 'beta: archived' a1.out && rc_is a2 0 && grep -qx 'beta: already archived' a2.out || return 1
    rc_is ast 0 && ! grep -q '^beta' ast.out && grep -q '^alpha' ast.out || { cat ast.out; return 1; }
    rc_is asta 0 && head -1 asta.out | grep -q ',created,archived,runner$' &&
        grep -Eq '^beta,1,.*,20[0-9-]+T[0-9:.]+Z,$' asta.out && grep -Eq '^alpha,.*,,$' asta.out || { cat asta.out; return 1; }
    rc_is aq 0 && ! grep -q '^beta-1,' aq.out && grep -q '^alpha-1,' aq.out || { cat aq.out; return 1; }
    rc_is aqa 0 && grep -q '^beta-1,' aqa.out || { cat aqa.out; return 1; }
    rc_is aqe 0 && grep -q '^beta-1,' aqe.out || return 1
    rc_is atop 0 && grep -q 'beta-1' atop.out && rc_is asb 0 && grep -q '^beta-1 ' asb.out || return 1
    rc_is abad 2
}
tap_check "archive: hidden from status and query, shown by --all, and by commands naming it" archive_ok

# Archiving hides, it does not forget: a point that completed in an archived experiment
# is still skipped by plan.
run_h ap plan beta.yaml --set name=beta2
tap_check "an archived experiment's completed points still count for plan dedup" \
    bash -c "grep -q 'skipped' '$T/ap.out' || { cat '$T/ap.out'; exit 1; }"
run_h u1 unarchive beta
run_h ust status
tap_check "unarchive: listed again" bash -c "[ \"\$(cat '$T/u1.rc')\" = 0 ] && grep -qx 'beta: not archived' '$T/u1.out' && grep -q '^beta ' '$T/ust.out'"

# ---- a cancelled run in the progress lines ----
spec gamma 5 6
: >hold
"$HEARTH_ABS" --db "$T/h.db" submit gamma.yaml --jobs 1 >g.out 2>g.err &
gpid=$!
wait_for 30 test -e runs/gamma/gamma-1/.held
run_h gc cancel gamma-1
rm -f hold
wait "$gpid"
echo $? >g.rc
run_h gw wait gamma
progress_ok() {
    rc_is gc 0 && rc_is g 1 || return 1
    [ "$(sql "select state from runs where run_id = 'gamma-1'")" = cancelled ] || return 1
    grep -q '^\[2/2\] running 0 · done 1 · failed 0 · cancelled 1$' g.err || { cat g.err; return 1; }
    ! grep -q 'failed 1' g.err || { cat g.err; return 1; }
    rc_is gw 1 && grep -q '^\[2/2\] running 0 · done 1 · failed 0 · cancelled 1$' gw.err || { cat gw.err; return 1; }
}
tap_check "a cancelled run counts as cancelled, not failed, in submit's and wait's progress lines" progress_ok
run_h gst status --format csv
tap_check "status counts it as cancelled" grep -q '^gamma,2,0,0,0,0,1,0,1,0,' gst.out

# ---- rm while a runner works: refused, --force too ----
spec delta 7
: >hold
run_h dsub submit delta.yaml --detach
wait_for 30 test -e runs/delta/delta-1/.held
run_h drm rm delta
run_h drmf rm --force delta --delete-runs
runner_refused_ok() {
    rc_is drm 1 && grep -q 'a runner (pid [0-9]* on .*) is working on delta' drm.err || return 1
    rc_is drmf 1 && grep -q 'a runner (pid' drmf.err || return 1
    [ "$(exp_count delta)" = 1 ] && [ "$(run_count delta)" = 1 ] && [ -d runs/delta/delta-1 ] || return 1
    [ -z "$(ls -A runs | grep '^\.')" ] || { ls -A runs; return 1; }
    [ "$(sql "select state from runs where run_id = 'delta-1'")" = running ]
}
tap_check "rm while a runner works on EXP: refused (exit 1), with --force too, nothing removed" runner_refused_ok

# ---- rm with live jobs and no runner: refused; --force cancels them ----
runner=$(cut -d' ' -f1 runs/delta/runner.lock)
kill -9 "$runner"
wait_for 30 flock -n runs/delta/runner.lock true
run_h lrm rm delta
kept=$(exp_count delta)
run_h lrmf rm --force delta
rm -f hold
live_ok() {
    rc_is lrm 1 && grep -q 'delta has 1 run submitted or running' lrm.err && grep -q -- '--force' lrm.err || return 1
    [ "$kept" = 1 ] || { echo "the refused rm removed delta"; return 1; }
    rc_is lrmf 0 && grep -qx 'delta-1: cancelled' lrmf.out && grep -q '^removed delta: 1 run; its run directories stay in ' lrmf.out || { cat lrmf.out lrmf.err; return 1; }
    flock -n runs/delta/delta-1/job.lock true || { echo "the job survived"; return 1; }
    [ "$(exp_count delta)" = 0 ] && [ "$(run_count delta)" = 0 ] && [ -d runs/delta/delta-1 ]
}
tap_check "rm with jobs alive and no runner: refused; --force cancels the jobs, then removes" live_ok

# ---- rm keeps the run directories; ingest brings the experiment back ----
run_h r1 rm alpha
run_h ing ingest runs/alpha
keep_ok() {
    rc_is r1 0 && grep -qx "removed alpha: 2 runs; its run directories stay in $T/runs/alpha (\`hearth ingest $T/runs/alpha\` records them again)" r1.out ||
        { cat r1.out r1.err; return 1; }
    [ -d runs/alpha/alpha-1 ] && [ -d runs/alpha/alpha-2 ] || return 1
    rc_is ing 0 && [ "$(run_count alpha)" = 2 ] && [ "$(sql "select count(*) from runs where run_id like 'alpha-%' and state = 'completed'")" = 2 ] ||
        { cat ing.out ing.err; return 1; }
}
tap_check "rm EXP: database rows gone, run directories kept; ingest records them again" keep_ok
gone_ok() {
    # nothing of alpha's first life was left behind: its tags went with it
    [ "$(sql "select count(*) from experiment_tags")" = 0 ] &&
        [ "$(sql "select count(*) from run_events e left join runs r on r.id = e.run where r.id is null")" = 0 ] &&
        [ "$(sql "select count(*) from results s left join runs r on r.id = s.run where r.id is null")" = 0 ]
}
tap_check "rm leaves no orphan rows (tags, history, results)" gone_ok

# ---- rm --delete-runs; a failed removal changes nothing ----
sql "CREATE TRIGGER no_rm BEFORE DELETE ON experiments BEGIN SELECT RAISE(ABORT, 'refused by the test'); END"
before=$(find runs/beta | sort | md5sum)
run_h fail rm --delete-runs beta
failed_ok() {
    rc_is fail 1 && grep -q 'refused by the test' fail.err || { cat fail.err; return 1; }
    [ "$(exp_count beta)" = 1 ] && [ "$(run_count beta)" = 1 ] || return 1
    [ "$(find runs/beta | sort | md5sum)" = "$before" ] || { echo "runs/beta changed"; return 1; }
    [ -z "$(ls -A runs | grep '^\.')" ] || { ls -A runs; return 1; }
}
tap_check "rm --delete-runs whose database removal fails: nothing removed, run directories back" failed_ok
sql "DROP TRIGGER no_rm"

run_h d1 rm --delete-runs beta alpha
run_h d2 rm beta
run_h d3 rm gamma nope
delete_ok() {
    rc_is d1 0 && grep -qx "removed beta: 1 run; deleted $T/runs/beta" d1.out &&
        grep -qx "removed alpha: 2 runs; deleted $T/runs/alpha" d1.out || { cat d1.out d1.err; return 1; }
    [ ! -e runs/beta ] && [ ! -e runs/alpha ] && [ -d runs/gamma ] || { ls -A runs; return 1; }
    [ -z "$(ls -A runs | grep '^\.')" ] || { ls -A runs; return 1; }
    [ "$(exp_count beta)" = 0 ] && [ "$(exp_count alpha)" = 0 ] || return 1
    rc_is d2 2 && grep -q "no experiment named 'beta'" d2.err || return 1
    rc_is d3 2 && grep -q "no experiment named 'nope'" d3.err && [ "$(exp_count gamma)" = 1 ] || return 1
}
tap_check "rm --delete-runs: run directories deleted; unknown names: exit 2, nothing removed" delete_ok

run_h fin status --all --format csv
tap_check "what is left: gamma, not delta, alpha or beta" \
    bash -c "[ \"\$(tail -n +2 '$T/fin.out' | cut -d, -f1 | tr '\n' ' ')\" = 'gamma ' ] || { cat '$T/fin.out'; exit 1; }"
