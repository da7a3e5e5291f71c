#!/usr/bin/env bash
# resources.pack through the slurm backend on the test cluster (contrib/slurm-local): 6
# tiny-vlm runs of one shape with pack 3 go as one sbatch of 2 array tasks, each task runs
# its 3 runs one after another with 3 x the time limit, and every run is tracked on its
# own (exit code, nodes, heartbeat, ingested results); a run failing inside a pack is
# failed alone, the others of its pack completed; a node failure in the middle of a pack:
# the run already finished stays completed, the running one and the one not started yet
# are requeued (and submitted again, each alone off the failed node).
set -u
cd "$(dirname "$0")/../.."
. tests/cli/hearth_slurm_common.bash
slurm_test slurm-pack slpack

tap_plan 7

cat >p.yaml <<EOF
name: slpack
$TINY_BASE
resources: {pack: 3, time: "00:02:00"}
matrix:
  train.seed: [1, 2, 3, 4, 5, 6]
EOF
run_h p submit p.yaml --backend slurm

pack_ok() {
    rc_is p 0 || return 1
    [ "$(sql "select count(*) from runs where state = 'completed' and backend = 'slurm'")" = 6 ] ||
        { sql "select run_id, state, exit_code, backend_job_id from runs"; return 1; }
    [ "$(sql "select count(*) from results where tokens_per_s > 0")" = 6 ] &&
        [ "$(sql "select count(distinct run) from run_config_kv")" = 6 ]
}
tap_check "6 runs with pack 3: all completed and ingested" pack_ok

jobs_ok() {
    # One sbatch: an array of 2 tasks with 3 x 2 minutes; 2 task ids for 6 runs.
    [ "$(grep -c '^sbatch ' calls.log)" = 1 ] && grep -q '^sbatch .*--array=0-1 .*--time=6 ' calls.log ||
        { grep '^sbatch' calls.log; return 1; }
    [ "$(sql "select count(distinct backend_job_id) from runs")" = 2 ] &&
        [ "$(sql "select count(*) from runs group by backend_job_id" | sort -u)" = 3 ] ||
        { sql "select run_id, backend_job_id from runs"; return 1; }
    # The same 2 jobs in Slurm's memory: one per array task.
    local id; id=$(sql "select backend_job_id from runs limit 1"); id=${id%_*}
    [ "$(PATH=${PATH#"$T/bin:"} squeue -h --array --states=all -j "$id" -o %i | sort -u | wc -l)" = 2 ] ||
        [ "$(PATH=${PATH#"$T/bin:"} scontrol -o show job "$id" 2>/dev/null | grep -c JobId=)" = 2 ] ||
        { PATH=${PATH#"$T/bin:"} scontrol -o show job "$id"; return 1; }
}
tap_check "pack 3: 6 runs as exactly 2 Slurm jobs (one sbatch, array 0-1, time 3 x 2 min)" jobs_ok

rundirs_ok() {
    local d
    for d in runs/slpack/slpack-*; do
        [ "$(cat "$d/exit_code")" = 0 ] && grep -qE '^n[0-9]+' "$d/nodes" && [ -s "$d/heartbeat" ] &&
            [ "$(cat "$d/exit_code.job")" = "$(sql "select backend_job_id from runs where run_id = '$(basename "$d")'")" ] &&
            grep -q "hearth: run $(basename "$d") " "$d/stdout.log" || { echo "$d"; ls "$d"; return 1; }
    done
    # Within a task, one run after another: each starts after the one before it ended.
    local prev="" prev_job="" t0 t1 job
    while IFS= read -r d; do
        job=$(cat "$d/exit_code.job")
        t0=$(grep -oE 'starting on .* at [0-9T:-]+Z' "$d/stdout.log" | grep -oE '[0-9T:-]+Z$')
        t1=$(grep -oE 'ended with status .* at [0-9T:-]+Z' "$d/stdout.log" | grep -oE '[0-9T:-]+Z$')
        [ -n "$t0" ] && [ -n "$t1" ] || { echo "$d: no start/end"; cat "$d/stdout.log"; return 1; }
        if [ "$job" = "$prev_job" ] && [[ "$t0" < "$prev" ]]; then
            echo "$d started at $t0 before the previous run of $job ended ($prev)"; return 1
        fi
        prev=$t1 prev_job=$job
    done < <(cat runs/slpack/arrays/*/runs)
}
tap_check "each run dir: its own exit_code (of its task), nodes, heartbeat, stdout.log; a task's runs one after another" rundirs_ok

# ---- one failing run inside a pack ----
cat >"$T/ftrainer.sh" <<EOF
#!/bin/bash
[ "\$HEARTH_RUN_ID" = "\$(cat "$T/fail_run")" ] && exit "\$(cat "$T/fail_code")"
exec "$TRAIN_ABS" "\$@"
EOF
chmod +x "$T/ftrainer.sh"
cat >f.yaml <<EOF
name: slpack-f
trainer: ./ftrainer.sh
$TINY_BASE
retries: 0
resources: {pack: 3}
matrix:
  train.seed: [11, 12, 13, 14, 15, 16]
EOF
victim=slpack-f-$(( RANDOM % 6 + 1 ))
code=$(( RANDOM % 50 + 3 ))
echo "$victim" >fail_run
echo "$code" >fail_code
run_h f submit f.yaml --backend slurm

fail_ok() {
    rc_is f 1 || return 1
    [ "$(sql "select state || '|' || exit_code from runs where run_id = '$victim'")" = "failed|$code" ] ||
        { echo "victim $victim"; sql "select run_id, state, exit_code, backend_job_id from runs where run_id like 'slpack-f-%'"; return 1; }
    [ "$(sql "select count(*) from runs where run_id like 'slpack-f-%' and state = 'completed'")" = 5 ] ||
        { sql "select run_id, state, exit_code from runs where run_id like 'slpack-f-%'"; return 1; }
}
tap_check "a run exiting with $code inside a pack: that run failed, the other 5 completed" fail_ok

mates_ok() {
    local job
    job=$(sql "select backend_job_id from runs where run_id = '$victim'")
    [ "$(sql "select count(*) from runs where backend_job_id = '$job' and state = 'completed'")" = 2 ] &&
        [ "$(sql "select count(*) from results r join runs u on u.id = r.run where u.backend_job_id = '$job'")" -ge 2 ] ||
        { sql "select run_id, state, backend_job_id from runs where run_id like 'slpack-f-%'"; sql "select * from results limit 1"; return 1; }
}
tap_check "the 2 other runs of the failing run's pack completed and were ingested" mates_ok

# ---- node failure in the middle of a pack ----
# The first run of the pack goes through; the next ones hold while $T/hold exists.
cat >"$T/htrainer.sh" <<EOF
#!/bin/bash
if [ -f "$T/hold" ] && [ -e "$T/started_one" ]; then
    : >"\$HEARTH_RUN_DIR/.held"
    while [ -f "$T/hold" ]; do sleep 0.1; done
fi
: >"$T/started_one"
exec "$TRAIN_ABS" "\$@"
EOF
chmod +x "$T/htrainer.sh"
cat >n.yaml <<EOF
name: slpack-n
trainer: ./htrainer.sh
$TINY_BASE
retries: 1
resources: {pack: 3}
matrix:
  train.seed: [21, 22, 23]
EOF
: >hold
run_h nsub submit n.yaml --backend slurm --detach
held_dir() { ls -d runs/slpack-n/slpack-n-*/.held 2>/dev/null | head -1 | xargs -r dirname; }
has_held() { [ -n "$(held_dir)" ]; }
wait_for 60 has_held
held=$(held_dir)
lst=$(ls runs/slpack-n/arrays/*/runs 2>/dev/null | head -1)
first=$(sed -n 1p "$lst" 2>/dev/null); first=$(basename "${first:-none}")
second=$(sed -n 2p "$lst" 2>/dev/null); second=$(basename "${second:-none}")
third=$(sed -n 3p "$lst" 2>/dev/null); third=$(basename "${third:-none}")
failed_node=$(cat "$held/nodes" 2>/dev/null)
echo "# $(date +%T) node down" >&2
[ -n "$failed_node" ] && slurm_node_down "$failed_node"
both_twice() {
    [ "$(sqlite3 -cmd '.timeout 10000' "$T/h.db" "select count(*) from runs where run_id in ('$second', '$third') and attempts = 2")" = 2 ]
}
wait_for 60 both_twice
echo "# $(date +%T) requeued" >&2
# The first attempt's processes end asynchronously: release the hold once they did.
wait_for 30 grep -q 'ended with status' "runs/slpack-n/$second/attempt-1/stdout.log"
echo "# $(date +%T) attempt 1 ended" >&2
rm -f hold
run_h nw wait slpack-n --timeout 120
[ -n "$SLURM_DOWN_NODE" ] && slurm_node_resume

ndiag() {
    echo "held $held; order $first $second $third"
    sql "select r.run_id, e.to_state, e.exit_code, e.note from run_events e join runs r on r.id = e.run where r.run_id like 'slpack-n-%' order by e.id"
    cat runs/slpack-n/runner.log 2>/dev/null | tail -5
}
nodefail_ok() {
    rc_is nw 0 || { ndiag; return 1; }
    [ "$held" = "runs/slpack-n/$second" ] || { ndiag; return 1; }
    [ "$(sql "select state || '|' || attempts from runs where run_id = '$first'")" = "completed|1" ] &&
        [ "$(sql "select group_concat(to_state, ',') from (select e.to_state from run_events e join runs r on r.id = e.run where r.run_id = '$first' order by e.id)")" = "submitted,running,completed" ] ||
        { ndiag; return 1; }
    local r
    for r in "$second" "$third"; do
        [ "$(sql "select state || '|' || attempts from runs where run_id = '$r'")" = "completed|2" ] &&
            sql "select e.to_state || ' ' || e.note from run_events e join runs u on u.id = e.run where u.run_id = '$r'" | grep -q '^requeued .*node failure' ||
            { ndiag; return 1; }
    done
}
tap_check "node failure in the middle of a pack: the finished run stays completed, the running and the unstarted one requeued, then completed" nodefail_ok

repack_ok() {
    # A run kept off the failed node goes alone (its sbatch options differ): 3 sbatch in all,
    # the second and third with --exclude of that node.
    [ "$(grep -c '^sbatch .*slpack-n' calls.log)" = 3 ] &&
        [ "$(grep '^sbatch .*slpack-n' calls.log | grep -c -- "--exclude=$failed_node ")" = 2 ] ||
        { grep '^sbatch .*slpack-n' calls.log; sql "select run_id, backend_job_id from runs where run_id like 'slpack-n-%'"; return 1; }
    [ "$(sql "select count(*) from results r join runs u on u.id = r.run where u.run_id like 'slpack-n-%'")" = 3 ]
}
tap_check "the 2 requeued runs submitted again off the failed node; all 3 ingested" repack_ok
