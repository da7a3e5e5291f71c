#!/usr/bin/env bash
# The slurmrest backend on the test cluster (contrib/slurm-local started by make test with
# --rest: slurmrestd on 127.0.0.1:$HEARTH_SLURM_REST_PORT, JWT, a token for root in
# DIR/rest/token): a sweep of 6 tiny-vlm CPU runs through slurmrestd (JWT over TCP) all
# completed and ingested, with the same configs and hashes as the same spec through the
# sbatch backend, no Slurm command run, one job listing per poll cycle; a failing run is
# failed with its exit code; the token appears in no file of the runs dir, nowhere in the
# database and in none of hearth's output; a token file that others may read is refused.
set -u
cd "$(dirname "$0")/../.."
. tests/cli/hearth_slurm_common.bash
slurm_test slurmrest slrest
slurmrest_setup

tap_plan 9

spec() {   # spec NAME: 6 runs of one shape
    cat <<EOF
name: $1
$TINY_BASE
resources: {partition: debug, sbatch: ["--mem=100"]}
matrix:
  train.seed: [1, 2, 3, 4, 5, 6]
EOF
}
spec slrest-a >a.yaml
spec slrest-b >b.yaml

log_lines() { wc -l <"$RESTLOG" 2>/dev/null || echo 0; }
before=$(log_lines)
start=$(( $(date +%s%N) / 1000000 ))
# The URL and token file as options here (the environment is tested below).
(unset HEARTH_SLURMREST_URL HEARTH_SLURMREST_TOKEN_FILE
 run_h ra submit a.yaml --backend slurmrest --rest-url "http://127.0.0.1:$REST_PORT" \
     --rest-token-file "$TOKEN_FILE")
end=$(( $(date +%s%N) / 1000000 ))
sed -n "$((before + 1)),\$p" "$RESTLOG" >rest_requests.log
run_h rb submit b.yaml --backend slurm

sweep_ok() {
    rc_is ra 0 || return 1
    [ "$(sql "select count(*) from runs r join experiments e on e.id = r.experiment_id where e.name = 'slrest-a' and r.state = 'completed' and r.backend = 'slurmrest'")" = 6 ] ||
        { sql "select run_id, state, backend, exit_code from runs"; cat ra.err; return 1; }
    grep -q '6 completed, 0 failed' ra.out
}
tap_check "6 runs through slurmrestd (JWT over TCP): all completed (exit 0)" sweep_ok

ingest_ok() {
    [ "$(sql "select count(*) from results s join runs r on r.id = s.run where r.run_id like 'slrest-a-%' and s.tokens_per_s > 0")" = 6 ] ||
        { sql "select * from results"; return 1; }
    for d in runs/slrest-a/slrest-a-*; do
        [ "$(cat "$d/exit_code")" = 0 ] && grep -qE '^n[0-9]+' "$d/nodes" &&
            grep -q "hearth: run $(basename "$d") " "$d/stdout.log" || { echo "$d"; ls "$d"; return 1; }
    done
}
tap_check "each run ingested (result with throughput); run dir: exit_code, nodes, its own stdout.log" ingest_ok

same_ok() {
    rc_is rb 0 || return 1
    local a b
    a=$(sql "select r.config_hash || ' ' || r.config_json from runs r where r.run_id like 'slrest-a-%' order by 1")
    b=$(sql "select r.config_hash || ' ' || r.config_json from runs r where r.run_id like 'slrest-b-%' order by 1")
    [ -n "$a" ] && [ "$a" = "$b" ] && [ "$(printf '%s\n' "$a" | wc -l)" = 6 ] ||
        { echo "slurmrest:"; echo "$a" | cut -c1-80; echo "sbatch:"; echo "$b" | cut -c1-80; return 1; }
    [ "$(sql "select count(*) from runs where run_id like 'slrest-b-%' and state = 'completed' and backend = 'slurm'")" = 6 ]
}
tap_check "the same spec through the sbatch backend: the same 6 configs and hashes, all completed" same_ok

nocmd_ok() {
    # calls.log: the sbatch/squeue/scontrol/scancel wrappers; only the sbatch experiment's.
    ! grep -q 'slrest-a' calls.log || { grep 'slrest-a' calls.log | head -3; return 1; }
    local n ms max
    n=$(grep -c 'GET /slurm/v0.0.38/jobs' rest_requests.log)
    ms=$((end - start))
    max=$((ms / HEARTH_SLURM_POLL_MS + 2))
    [ "$n" -ge 1 ] && [ "$n" -le "$max" ] || { echo "$n job listings in $ms ms (max $max)"; return 1; }
    [ "$(grep -c 'POST /slurm/v0.0.38/job/submit' rest_requests.log)" = 6 ] ||
        { grep -c 'POST' rest_requests.log; return 1; }
    ! grep -qE 'GET /slurm/v0.0.38/job/[0-9]' rest_requests.log
}
tap_check "slurmrest runs no Slurm command; 6 POSTs and one GET of the job listing per poll cycle (v0.0.38)" nocmd_ok

# ---- a failing run ----
slurm_check_failing_run slrest-fail slurmrest " through slurmrest"

# ---- cancel a running job (hearth cancel: DELETE .../job/ID) ----
cat >c.yaml <<EOF
name: slrest-cancel
trainer: ./trainer.sh
$TINY_BASE
retries: 0
EOF
: >hold
before=$(log_lines)
run_h cs submit c.yaml --backend slurmrest --detach
wait_for 30 test -e runs/slrest-cancel/slrest-cancel-1/.held
run_h cancel cancel slrest-cancel-1
run_h cw wait slrest-cancel --timeout 60
rm -f hold
cancel_ok() {
    rc_is cs 0 && rc_is cancel 0 || return 1
    [ "$(sql "select state from runs where run_id = 'slrest-cancel-1'")" = cancelled ] ||
        { sql "select run_id, state from runs"; cat runs/slrest-cancel/runner.log; return 1; }
    id=$(sql "select backend_job_id from runs where run_id = 'slrest-cancel-1'")
    sed -n "$((before + 1)),\$p" "$RESTLOG" | grep -q "DELETE /slurm/v0.0.38/job/$id\$" ||
        { echo "no DELETE of job $id"; return 1; }
    ! grep -q '^scancel' calls.log || return 1
    st=$(squeue -h -t all -j "$id" -o %T 2>/dev/null)
    [ -z "$st" ] || [ "${st#CANCELLED}" != "$st" ] || { echo "slurm state $st"; return 1; }
    rc_is cw 1
}
tap_check "hearth cancel RUN through slurmrest: DELETE of its job, state cancelled, hearth wait ends (exit 1)" cancel_ok

# ---- the token never leaves hearth's memory ----
secret_ok() {
    [ "${#TOKEN}" -ge 20 ] || { echo "token too short to search for"; return 1; }
    local hits
    hits=$(grep -rlF -- "$TOKEN" runs 2>/dev/null)
    [ -z "$hits" ] || { echo "token in: $hits"; return 1; }
    sqlite3 -cmd '.timeout 10000' h.db .dump >dump.sql && [ -s dump.sql ] || { echo "no dump"; return 1; }
    ! grep -qF -- "$TOKEN" dump.sql || { echo "token in the database"; return 1; }
    for f in ra.out ra.err fail.out fail.err cs.out cs.err cancel.out cancel.err; do
        ! grep -qF -- "$TOKEN" "$f" || { echo "token in hearth's output ($f)"; return 1; }
    done
}
tap_check "the token is in no file under runs/, not in the database, not in hearth's output" secret_ok

# ---- a token file others may read ----
cat >m.yaml <<EOF
name: slrest-mode
$TINY_BASE
EOF
cp "$TOKEN_FILE" loose.token
chmod 644 loose.token
run_h mode submit m.yaml --backend slurmrest --rest-token-file "$T/loose.token"
mode_ok() {
    rc_is mode 2 || return 1
    grep -q "loose.token has mode 0644" mode.err && grep -q 'chmod 600' mode.err ||
        { sed "s/$TOKEN/<token>/g" mode.err; return 1; }
    ! grep -qF -- "$TOKEN" mode.err mode.out || { echo "token in the message"; return 1; }
    [ "$(sql "select count(*) from runs where run_id like 'slrest-mode-%'")" = 0 ]
}
tap_check "a token file with mode 0644: refused (exit 2) with a clear message, nothing submitted" mode_ok

# ---- wrong token, no URL ----
( umask 077; echo "not-a-valid-token" >bad.token )
run_h bad submit m.yaml --backend slurmrest --rest-token-file "$T/bad.token"
(unset HEARTH_SLURMREST_URL; run_h nourl submit m.yaml --backend slurmrest)
errors_ok() {
    rc_is nourl 2 || return 1
    grep -q 'HEARTH_SLURMREST_URL' nourl.err || { cat nourl.err; return 1; }
    [ "$(cat bad.rc)" != 0 ] || { echo "a bad token was accepted"; return 1; }
    grep -q 'slurmrest' bad.err || { cat bad.err; return 1; }
    [ "$(sql "select count(*) from runs where run_id like 'slrest-mode-%' and state = 'completed'")" = 0 ]
}
tap_check "no URL: usage error naming HEARTH_SLURMREST_URL; an invalid token: an error, nothing completed" errors_ok
