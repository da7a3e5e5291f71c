#!/usr/bin/env bash
# kill -9 of hearth while it ingests a large experiment (local backend): a trainer stand-in
# writes a long metrics.jsonl per run, all jobs start at once, so the runner spends its
# time ingesting; it is killed outright part way, twice.  The database passes
# `PRAGMA integrity_check` after each kill, and `hearth resume` finishes the experiment to
# exactly the content of an uninterrupted submit of the same spec (runs, results,
# metrics).
set -u
cd "$(dirname "$0")/../.."
. tests/cli/lib.sh
. tests/cli/hearth_common.bash
hearth_tmp ingest-kill

RUNS=12
STEPS=${HEARTH_TEST_INGEST_STEPS:-20000}
tap_plan 6

# The stand-in trainer: metrics and result that depend only on the run id and config
# hash, so the two databases can be compared row by row.
cat >"$T/bigtrainer.sh" <<EOF
#!/bin/bash
awk -v n=$STEPS -v id="\$HEARTH_RUN_ID" 'BEGIN {
    s = 0; for (i = 1; i <= length(id); i++) s = s * 31 % 1000003 + index("0123456789abcdefghijklmnopqrstuvwxyz-", substr(id, i, 1))
    for (i = 1; i <= n; i++)
        printf "{\"step\":%d,\"loss\":%.9g,\"grad_norm\":%.6g,\"lr\":0.001,\"step_ms\":%d,\"tokens\":128,\"tokens_per_s\":%d,\"peak_mem_bytes\":%d}\n", i, 10 / (i + s % 97), (s + i) % 1000 / 7, 5 + (s + i) % 7, 1000 + (s * i) % 13, 1000000 + s
}' >"\$HEARTH_RUN_DIR/metrics.jsonl"
cat >"\$HEARTH_RUN_DIR/result.json" <<JSON
{"config_hash": "\$HEARTH_CONFIG_HASH", "steps": $STEPS, "step_ms_median": 5, "tokens_per_s": 1000,
 "final_loss": 0.5, "exit_status": "done", "device": "cpu", "device_count": 1, "nodes": 1,
 "versions": {"hearth": "test"}}
JSON
EOF
chmod +x "$T/bigtrainer.sh"

mkdir -p ref kill
for d in ref kill; do
    cat >"$d/s.yaml" <<EOF
name: big
trainer: $T/bigtrainer.sh
$TINY_BASE
matrix:
  train.lr: [1.0e-3, 2.0e-3, 3.0e-3, 4.0e-3]
  train.seed: [1, 2, 3]
EOF
done

# dump DIR: what the experiment recorded, without times and paths.
dump() {
    sqlite3 -batch -noheader "$1/h.db" "
        select 'run', run_id, config_hash, state, exit_code, attempts from runs order by run_id;
        select 'result', r.run_id, s.steps, s.step_ms_median, s.tokens_per_s, s.final_loss,
               s.exit_status, s.device, s.device_count, s.nodes, s.versions, s.extra
          from results s join runs r on r.id = s.run order by r.run_id;
        select 'metrics', r.run_id, count(*), sum(m.step), total(m.loss), total(m.grad_norm),
               total(m.step_ms), sum(m.tokens), total(m.tokens_per_s), sum(m.peak_mem_bytes)
          from metrics m join runs r on r.id = m.run group by r.run_id order by r.run_id;"
}
# Also every metric row of one run, exactly.
rows() { sqlite3 -batch -noheader "$1/h.db" "select m.* from metrics m join runs r on r.id = m.run where r.run_id = '$2' order by m.step"; }

(cd ref && "$HEARTH_ABS" --db h.db submit s.yaml --backend local --jobs $RUNS >sub.out 2>sub.err)
ref_ok() {
    [ "$(sqlite3 ref/h.db "select count(*) from runs where state = 'completed'")" = $RUNS ] &&
        [ "$(sqlite3 ref/h.db "select count(*) from metrics")" = $((RUNS * STEPS)) ] ||
        { cat ref/sub.err; sqlite3 ref/h.db "select run_id, state from runs"; return 1; }
}
tap_check "reference: an uninterrupted submit records $RUNS runs of $STEPS steps" ref_ok

# Starts hearth in kill/ and kills it with SIGKILL once `done` runs are recorded (and
# before all are): the kill lands in the ingest loop.
kill_after() {   # kill_after DONE CMD...
    local want=$1; shift
    (cd kill && exec "$HEARTH_ABS" --db h.db "$@" >>run.out 2>>run.err) &
    local pid=$! n=0 i=0
    while [ "$i" -lt 1200 ]; do
        n=$(sqlite3 -cmd '.timeout 2000' kill/h.db "select count(*) from results" 2>/dev/null || echo 0)
        [ "${n:-0}" -ge "$want" ] && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.05; i=$((i + 1))
    done
    kill -9 "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    echo "$n" >kill/recorded
}

mid_ok() {   # the kill happened part way: some runs recorded, some finished but not yet
    local n; n=$(cat kill/recorded)
    [ "$n" -ge 1 ] && [ "$n" -lt $RUNS ] || { echo "$n runs recorded at the kill"; return 1; }
    [ "$(sqlite3 kill/h.db 'pragma integrity_check')" = ok ] || return 1
    [ "$(sqlite3 kill/h.db 'pragma foreign_key_check')" = "" ] || return 1
    # Every recorded run is whole: all its steps, or none.
    local partial; partial=$(sqlite3 kill/h.db "select r.run_id, count(m.step) from runs r left join metrics m on m.run = r.id group by r.id having count(m.step) not in (0, $STEPS)")
    [ -z "$partial" ] || { echo "partly recorded runs: $partial"; return 1; }
}
kill_after 3 submit s.yaml --backend local --jobs $RUNS
tap_check "kill -9 during the submit's ingest ($(cat kill/recorded) of $RUNS recorded): integrity_check ok, no run partly recorded" mid_ok
kill_after 7 resume big --jobs $RUNS
tap_check "kill -9 during resume's ingest ($(cat kill/recorded) of $RUNS recorded): integrity_check ok, no run partly recorded" mid_ok

(cd kill && "$HEARTH_ABS" --db h.db resume big --jobs $RUNS >resume.out 2>resume.err)
echo $? >kill/resume.rc
resume_ok() {
    [ "$(cat kill/resume.rc)" = 0 ] || { cat kill/resume.err; return 1; }
    [ "$(sqlite3 kill/h.db 'pragma integrity_check')" = ok ]
}
tap_check "hearth resume finishes the experiment; integrity_check ok" resume_ok
same_ok() {
    diff <(dump ref) <(dump kill) || return 1
    local id
    for id in big-1 big-6 big-12; do diff <(rows ref "$id") <(rows kill "$id") >/dev/null || { echo "metrics of $id differ"; return 1; }; done
}
tap_check "the resumed database holds the same runs, results and metrics as the uninterrupted one" same_ok
again_ok() {
    (cd kill && "$HEARTH_ABS" --db h.db resume big >again.out 2>again.err) || { cat kill/again.err; return 1; }
    diff <(dump ref) <(dump kill)
}
tap_check "resuming again changes nothing" again_ok
