#!/usr/bin/env bash
# A sweep through the slurm backend on the test cluster (contrib/slurm-local, started by
# make test with MaxArraySize=5): 12 tiny-vlm CPU runs of one shape go as job arrays split
# by MaxArraySize and throttled by resources.max_concurrent, all completed and ingested
# (config and throughput in SQLite), and the poll cost: one squeue per poll cycle for all
# live jobs, counted through a wrapper on PATH.
set -u
cd "$(dirname "$0")/../.."
. tests/cli/hearth_slurm_common.bash
slurm_test slurm-sweep slsweep

tap_plan 6

cat >s.yaml <<EOF
name: slsweep
$TINY_BASE
resources: {max_concurrent: 3, partition: debug, sbatch: ["--mem=100"]}
matrix:
  train.seed: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
EOF
start=$(( $(date +%s%N) / 1000000 ))
run_h sw submit s.yaml --backend slurm
end=$(( $(date +%s%N) / 1000000 ))

sweep_ok() {
    rc_is sw 0 || return 1
    [ "$(sql "select count(*) from runs where state = 'completed' and backend = 'slurm'")" = 12 ] ||
        { sql "select run_id, state, exit_code from runs"; return 1; }
    grep -q '12 completed, 0 failed' sw.out
}
tap_check "12 runs submitted with sbatch: all completed (exit 0)" sweep_ok

ingest_ok() {
    [ "$(sql "select count(*) from results where tokens_per_s > 0")" = 12 ] || { sql "select * from results"; return 1; }
    [ "$(sql "select count(distinct r.config_hash) from runs r")" = 12 ] &&
        [ "$(sql "select count(*) from metrics")" -ge 36 ] &&
        [ "$(sql "select count(distinct run) from run_config_kv")" = 12 ]
}
tap_check "each run ingested: result with throughput, 3 metric steps, flattened config" ingest_ok

max_array=$(PATH=${PATH#"$T/bin:"} scontrol show config | awk '$1 == "MaxArraySize" {print $3}')
arrays_ok() {
    local want=$(( (12 + max_array - 1) / max_array )) got
    got=$(grep -c '^sbatch .*--array=' calls.log)
    [ "$got" = "$want" ] || { echo "$got arrays, want $want (MaxArraySize $max_array)"; grep '^sbatch' calls.log; return 1; }
    # Each array holds at most MaxArraySize tasks and carries the %3 throttle.
    grep '^sbatch ' calls.log | grep -oE -- '--array=0-[0-9]+%3 ' | sed 's/--array=0-//; s/%3 //' |
        awk -v m="$max_array" '$1 + 1 > m {bad = 1} END {exit bad}' || { grep '^sbatch' calls.log; return 1; }
    # resources.partition and resources.sbatch on every sbatch line.
    [ "$(grep '^sbatch ' calls.log | grep -c -- '--partition=debug .*--mem=100 ')" = "$want" ] || { grep '^sbatch' calls.log; return 1; }
    [ "$(grep -c '^sbatch ' calls.log)" = "$want" ] &&
        [ "$(sql "select count(distinct backend_job_id) from runs where backend_job_id glob '[0-9]*_[0-9]*'")" = 12 ]
}
tap_check "12 runs of one shape: $(( (12 + max_array - 1) / max_array )) job arrays (MaxArraySize $max_array), throttled with %3, partition and sbatch options passed" arrays_ok

rundirs_ok() {
    # Every run dir holds its exit code, the node it ran on and a heartbeat; the array
    # task found its run through SLURM_ARRAY_TASK_ID and logged into the run dir.
    for d in runs/slsweep/slsweep-*; do
        [ "$(cat "$d/exit_code")" = 0 ] && grep -qE '^n[0-9]+' "$d/nodes" && [ -s "$d/heartbeat" ] &&
            grep -q "hearth: run $(basename "$d") " "$d/stdout.log" || { echo "$d"; ls "$d"; return 1; }
    done
}
tap_check "each run dir: exit_code, nodes, heartbeat, its own stdout.log" rundirs_ok

poll_ok() {
    local n ms max
    n=$(calls squeue)
    ms=$((end - start))
    # One squeue per cycle of HEARTH_SLURM_POLL_MS (500 ms), plus one slack: never one
    # per job (that would be at least 12 per cycle).
    max=$((ms / HEARTH_SLURM_POLL_MS + 2))
    [ "$n" -ge 1 ] && [ "$n" -le "$max" ] || { echo "$n squeue calls in ${ms} ms (max $max)"; return 1; }
    # Every call asks for all live jobs at once: the first lists all 12.
    grep -m1 '^squeue ' calls.log | grep -qE -- '--jobs ([0-9_]+,){11}[0-9_]+ ' || { grep '^squeue' calls.log | head -3; return 1; }
}
tap_check "poll cost: one batched squeue per poll cycle (all 12 jobs in one call)" poll_ok

noctl_ok() {
    # Every job left an exit code file: no `scontrol show job` was needed (one `scontrol
    # show config` reads MaxArraySize), nothing cancelled.
    [ "$(grep -c '^scontrol ' calls.log)" = "$(grep -c '^scontrol show config' calls.log)" ] &&
        [ "$(grep -c '^scontrol show config' calls.log)" -le 1 ] && [ "$(calls scancel)" = 0 ]
}
tap_check "no scontrol show job or scancel when every job left its exit code" noctl_ok
