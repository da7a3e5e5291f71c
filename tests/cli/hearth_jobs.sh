#!/usr/bin/env bash
# The life of a local job: wall-time limit (state timeout), retries (a new attempt of the
# same run, the old logs kept aside), logs and logs -f, cancelling one run, Ctrl-C on a
# foreground sweep, `after` ordering between experiments, resources.setup and
# cpus_per_task in the job's environment, --jobs as a limit on concurrency.
set -u
cd "$(dirname "$0")/../.."
. tests/cli/lib.sh
. tests/cli/hearth_common.bash
hearth_tmp jobs
make_trainer

tap_plan 12

# ---- timeout ----
cat >t.yaml <<EOF
name: slowpoke
trainer: ./trainer.sh
$TINY_BASE
resources: {time: "0:01"}
EOF
echo 30 >slow
start=$(date +%s)
run_h to submit t.yaml
rm -f slow
timeout_ok() {
    rc_is to 1 || return 1
    [ "$(sql "select state from runs where run_id = 'slowpoke-1'")" = timeout ] || { sql "select run_id, state from runs"; return 1; }
    [ $(( $(date +%s) - start )) -lt 25 ] || { echo "the limit was not enforced in time (the job sleeps 30 s)"; return 1; }
    grep -q 'timed out' to.err && flock -n runs/slowpoke/slowpoke-1/job.lock true
}
tap_check "resources.time reached: SIGTERM to the job, state timeout, exit 1" timeout_ok

# ---- retries ----
cat >r.yaml <<EOF
name: retry
trainer: ./trainer.sh
$TINY_BASE
retries: 2
EOF
: >fail_once
run_h re submit r.yaml
rm -f fail_once
retry_ok() {
    rc_is re 0 || return 1
    [ "$(sql "select state, attempts from runs where run_id = 'retry-1'")" = "completed|2" ] || { sql "select * from runs"; return 1; }
    [ "$(sql "select count(*) from runs r join experiments e on e.id = r.experiment_id where e.name = 'retry'")" = 1 ] || return 1
    [ "$(cat runs/retry/retry-1/attempt-1/exit_code)" = 1 ] || { echo "attempt-1/exit_code"; return 1; }
    grep -q 'failing the first attempt' runs/retry/retry-1/attempt-1/stderr.log &&
        [ "$(cat runs/retry/retry-1/exit_code)" = 0 ] &&
        [ "$(sql "select group_concat(to_state, ',') from (select e.to_state from run_events e join runs r on r.id = e.run where r.run_id = 'retry-1' order by e.id)")" = "submitted,running,requeued,submitted,running,completed" ]
}
tap_check "a failed attempt is retried as attempt 2 of the same run (running -> requeued -> submitted)" retry_ok

echo 1 >fail
cat >r2.yaml <<EOF
name: retry-out
trainer: ./trainer.sh
$TINY_BASE
retries: 1
EOF
run_h re2 submit r2.yaml
rm -f fail
tap_check "retries used up: failed after 1 + retries attempts" bash -c "[ \"\$(cat '$T/re2.rc')\" = 1 ] && [ \"\$(sqlite3 -cmd '.timeout 10000' '$T/h.db' \"select state, attempts from runs where run_id = 'retry-out-1'\")\" = 'failed|2' ]"

# ---- a preempted attempt without a checkpoint ----
# The trainer's outputs stay in place after exit 75 (for its checkpoint); with none, the
# next attempt starts afresh and must be let to replace them (--force): hearth-train
# refuses a run directory holding results otherwise.
cat >"$T/preempt_once.sh" <<EOF
#!/bin/bash
"$TRAIN_ABS" "\$@" || exit
[ -e "\$HEARTH_RUN_DIR/.preempted" ] && exit 0
: >"\$HEARTH_RUN_DIR/.preempted"
exit 75
EOF
chmod +x "$T/preempt_once.sh"
cat >p.yaml <<EOF
name: preempt
trainer: ./preempt_once.sh
$TINY_BASE
retries: 1
EOF
run_h pre submit p.yaml
preempt_ok() {
    local d=runs/preempt/preempt-1
    rc_is pre 0 || return 1
    [ "$(sql "select state, attempts from runs where run_id = 'preempt-1'")" = "completed|2" ] ||
        { sql "select run_id, state, attempts, exit_code from runs"; cat "$d/stderr.log"; return 1; }
    [ "$(cat "$d/attempt-1/exit_code")" = 75 ] && [ ! -e "$d/checkpoints" ] &&
        [ "$(grep -c '"step"' "$d/metrics.jsonl")" = 3 ] &&
        grep -q -- '--force: the results of the earlier run' "$d/train.log" ||
        { cat "$d/stderr.log"; return 1; }
}
tap_check "an attempt preempted (exit 75) without a checkpoint: the next one starts afresh over its outputs" preempt_ok

# ---- logs ----
run_h logs logs retry-1
logs_ok() {
    rc_is logs 0 && grep -q 'hearth: run retry-1 starting' logs.out &&
        grep -q '^step 3/3 loss' logs.err
}
tap_check "logs RUN: stdout.log on stdout, stderr.log on stderr" logs_ok

# logs -f follows a run until it ends.
cat >l.yaml <<EOF
name: follow
trainer: ./trainer.sh
$TINY_BASE
EOF
echo 2 >slow
run_h fdet submit l.yaml --detach
wait_for 10 bash -c "[ -s '$T/runs/follow/follow-1/stdout.log' ]"
"$HEARTH_ABS" --db "$T/h.db" logs -f follow-1 >lf.out 2>lf.err
lf_rc=$?
rm -f slow
follow_ok() {
    [ "$lf_rc" = 0 ] && grep -q 'ended with status 0' lf.out && grep -q '^done: 3 steps' lf.err ||
        { cat lf.out lf.err; return 1; }
    [ "$(sql "select state from runs where run_id = 'follow-1'")" = completed ] ||
        wait_for 5 bash -c "[ \"\$(sqlite3 -cmd '.timeout 10000' '$T/h.db' \"select state from runs where run_id = 'follow-1'\")\" = completed ]"
}
tap_check "logs -f: follows until the run ends" follow_ok

# ---- cancel one run of a foreground sweep ----
cat >c1.yaml <<EOF
name: cancel-one
trainer: ./trainer.sh
$TINY_BASE
matrix:
  train.seed: [1, 2]
EOF
echo 30 >slow
"$HEARTH_ABS" --db "$T/h.db" submit c1.yaml --jobs 1 >c1.out 2>c1.err &
pid=$!
wait_for 20 bash -c "[ \"\$(sqlite3 -cmd '.timeout 10000' '$T/h.db' \"select state from runs where run_id = 'cancel-one-1'\")\" = running ]"
rm -f slow
run_h cone cancel cancel-one-1
wait "$pid"
c1_rc=$?
cancel_one_ok() {
    rc_is cone 0 || return 1
    [ "$(sql "select state from runs where run_id = 'cancel-one-1'")" = cancelled ] || return 1
    [ "$(sql "select state from runs where run_id = 'cancel-one-2'")" = completed ] || { cat c1.err; return 1; }
    [ "$c1_rc" = 1 ]
}
tap_check "cancel RUN: that run cancelled, the sweep goes on with the others (exit 1)" cancel_one_ok

# ---- Ctrl-C on a foreground sweep ----
cat >i.yaml <<EOF
name: interrupted
trainer: ./trainer.sh
$TINY_BASE
matrix:
  train.seed: [1, 2, 3]
EOF
echo 30 >slow
"$HEARTH_ABS" --db "$T/h.db" submit i.yaml --jobs 1 >int.out 2>int.err &
pid=$!
wait_for 20 bash -c "[ \"\$(sqlite3 -cmd '.timeout 10000' '$T/h.db' \"select state from runs where run_id = 'interrupted-1'\")\" = running ]"
kill -INT "$pid"
wait "$pid"
int_rc=$?
rm -f slow
int_ok() {
    [ "$int_rc" = 1 ] || { echo "exit $int_rc"; return 1; }
    [ "$(sql "select state from runs where run_id = 'interrupted-1'")" = requeued ] &&
        [ "$(sql "select count(*) from runs where run_id like 'interrupted-%' and state = 'pending'")" = 2 ] &&
        flock -n runs/interrupted/interrupted-1/job.lock true
}
tap_check "SIGINT: running job stopped, its run requeued (interrupted, not cancelled), pending runs stay pending" int_ok
run_h intres resume interrupted
tap_check "resume finishes the interrupted sweep, the interrupted run included" bash -c "[ \"\$(cat '$T/intres.rc')\" = 0 ] && [ \"\$(sqlite3 -cmd '.timeout 10000' '$T/h.db' \"select count(*) from runs where run_id like 'interrupted-%' and state = 'completed'\")\" = 3 ]"

# ---- after: waits for another experiment; on: ok refuses after a failure ----
cat >a.yaml <<EOF
name: second
trainer: ./trainer.sh
$TINY_BASE
after: {experiment: retry-out, on: ok}
EOF
run_h after submit a.yaml
tap_check "after: {on: ok} with a failed experiment: the run is cancelled (exit 1)" bash -c "[ \"\$(cat '$T/after.rc')\" = 1 ] && [ \"\$(sqlite3 -cmd '.timeout 10000' '$T/h.db' \"select state from runs where run_id = 'second-1'\")\" = cancelled ] && grep -q 'did not end ok' '$T/after.err'"

# ---- setup lines and cpus_per_task reach the job; --jobs limits concurrency ----
cat >e.yaml <<EOF
name: env
trainer: ./trainer.sh
$TINY_BASE
resources:
  cpus_per_task: 2
  setup: ["export FROM_SETUP=yes", "echo \"omp=\$OMP_NUM_THREADS setup=\$FROM_SETUP\""]
EOF
run_h env submit e.yaml
tap_check "resources.setup runs in the job; OMP_NUM_THREADS = cpus_per_task" bash -c "[ \"\$(cat '$T/env.rc')\" = 0 ] && grep -q 'omp=2 setup=yes' '$T/runs/env/env-1/stdout.log'"

cat >j.yaml <<EOF
name: jobs
trainer: ./trainer.sh
$TINY_BASE
matrix:
  train.seed: [1, 2, 3, 4, 5]
EOF
echo 0.3 >slow
run_h jobs submit j.yaml --jobs 2
rm -f slow
# No more than 2 runs overlapped: order the start/end events and count.
jobs_ok() {
    rc_is jobs 0 || return 1
    local max
    max=$(sql "select max(c) from (select (select count(*) from runs b join experiments e on e.id = b.experiment_id where e.name = 'jobs' and b.started_at <= a.started_at and b.ended_at > a.started_at) c from runs a join experiments e on e.id = a.experiment_id where e.name = 'jobs')")
    [ "$max" -le 2 ] && [ "$max" -ge 2 ] || { echo "max concurrency $max"; return 1; }
}
tap_check "--jobs 2: never more than 2 runs at once (and 2 do overlap)" jobs_ok
