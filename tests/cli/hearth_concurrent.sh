#!/usr/bin/env bash
# Two hearth processes on one database at once (local backend): concurrent `submit`s of
# the same spec and of an overlapping spec (same experiment, more points), with `status`
# and `wait` polling meanwhile.  No point gets a duplicate run, every run completes once
# (its trainer ran once), no state change is lost (each run's state is the last state of
# its history, results and metrics are all there) and no poll fails on a busy database.
set -u
cd "$(dirname "$0")/../.."
. tests/cli/lib.sh
. tests/cli/hearth_common.bash
hearth_tmp concurrent
make_trainer

ROUNDS=3
tap_plan $((ROUNDS * 4 + 2))

# spec NAME SEEDS: lr x seed, the seed list as given.
spec() {
    cat <<EOF
name: $1
trainer: ./trainer.sh
$TINY_BASE
matrix:
  train.lr: [1.0e-3, 2.0e-3]
  train.seed: [$2]
EOF
}

# poll EXP: status and status EXP in a loop until $T/stop_poll exists; every failure is
# logged to $T/poll.err (but for the database or EXP not being there yet, before the
# first submit gets to them).
poll() {
    local out what
    while [ ! -e "$T/stop_poll" ]; do
        for what in "" "$1"; do
            out=$(h status $what 2>&1 >/dev/null) ||
                grep -qE "no experiment named '$1'|no such database" <<<"$out" ||
                printf 'status %s failed: %s\n' "$what" "$out" >>"$T/poll.err"
        done
    done
}

# The checks of one experiment with `want` points.
no_duplicates() {   # no_duplicates EXP WANT
    local dup; dup=$(sql "select r.config_hash, count(*) from runs r join experiments e on e.id = r.experiment_id where e.name = '$1' group by r.config_hash having count(*) > 1")
    [ -z "$dup" ] || { echo "duplicate runs: $dup"; sql "select run_id, config_hash, state from runs"; return 1; }
    local n; n=$(sql "select count(*) from runs r join experiments e on e.id = r.experiment_id where e.name = '$1'")
    [ "$n" = "$2" ] || { echo "$n runs, want $2"; sql "select run_id, state from runs"; return 1; }
    local ran; ran=$(grep -c " $1-" invocations.log)
    [ "$ran" = "$2" ] || { echo "trainer ran $ran times for $2 runs"; cat invocations.log; return 1; }
    [ -z "$(cut -d' ' -f2 invocations.log | sort | uniq -d)" ] || { echo "a run was started twice"; return 1; }
}
all_recorded() {    # all_recorded EXP WANT
    local where="r.experiment_id = (select id from experiments where name = '$1')"
    [ "$(sql "select count(*) from runs r where $where and state = 'completed' and attempts = 1")" = "$2" ] ||
        { echo "not all completed once:"; sql "select run_id, state, attempts from runs r where $where"; return 1; }
    [ "$(sql "select count(*) from results s join runs r on r.id = s.run where $where")" = "$2" ] ||
        { echo "results missing"; return 1; }
    [ "$(sql "select count(*) from metrics m join runs r on r.id = m.run where $where")" = $(($2 * 3)) ] ||
        { echo "metrics missing"; return 1; }
    # Lost update: a run's state is the last state its history moved it to.
    local bad; bad=$(sql "select r.run_id from runs r where $where and r.state != (select e.to_state from run_events e where e.run = r.id order by e.id desc limit 1)")
    [ -z "$bad" ] || { echo "state differs from its last event: $bad"; return 1; }
}

for round in $(seq 1 "$ROUNDS"); do
    exp=conc$round
    spec "$exp" "1, 2" >a.yaml
    # Round 1: the same spec twice; later rounds: the second spec has more points.
    if [ "$round" = 1 ]; then cp a.yaml b.yaml; want=4; else spec "$exp" "1, 2, 3" >b.yaml; want=6; fi
    rm -f stop_poll poll.err
    poll "$exp" & poller=$!
    run_h "a$round" submit a.yaml --backend local --jobs 2 &
    pa=$!
    run_h "b$round" submit b.yaml --backend local --jobs 2 &
    pb=$!
    wait "$pa" "$pb"
    run_h "w$round" wait "$exp"
    : >stop_poll
    wait "$poller"
    tap_check "round $round: both submits and the wait exit 0" \
        bash -c "[ \$(cat $T/a$round.rc) = 0 ] && [ \$(cat $T/b$round.rc) = 0 ] && [ \$(cat $T/w$round.rc) = 0 ] || { cat $T/a$round.err $T/b$round.err $T/w$round.err; exit 1; }"
    tap_check "round $round: $want runs, one per point, each run started once" no_duplicates "$exp" "$want"
    tap_check "round $round: every run completed once, results, metrics and history recorded" \
        all_recorded "$exp" "$want"
    tap_check "round $round: no status poll failed meanwhile" \
        bash -c "[ ! -s $T/poll.err ] || { cat $T/poll.err; exit 1; }"
done

# Both submits again after the fact: nothing new is created or run.
before=$(wc -l <invocations.log)
run_h again1 submit a.yaml --backend local & p1=$!
run_h again2 submit b.yaml --backend local & p2=$!
wait "$p1" "$p2"
again_ok() {
    rc_is again1 0 && rc_is again2 0 || return 1
    [ "$(wc -l <invocations.log)" = "$before" ] || { echo "completed points ran again"; return 1; }
    no_duplicates "conc$ROUNDS" 6
}
tap_check "concurrent submits of completed specs create and run nothing" again_ok
tap_check "database integrity after all rounds" bash -c "[ \"\$(sqlite3 $T/h.db 'pragma integrity_check')\" = ok ]"
