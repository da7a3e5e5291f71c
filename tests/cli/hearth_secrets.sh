#!/usr/bin/env bash
# The slurmrestd token stays secret (no Slurm cluster needed: tests/cli/mock_slurmrestd.py
# stands in for slurmrestd and runs the jobs locally).  Sweeps through the slurmrest
# backend with the token from --rest-token-file, from $HEARTH_SLURMREST_TOKEN_FILE, from
# $SLURM_JWT, and one detached: every request carries the token as X-SLURM-USER-TOKEN (the
# stand-in refuses others) and the token is in no request body (job script, job
# environment), no file under runs/ (job scripts, logs, the trainer's environment, the
# runner's log), not in the database and not in anything hearth printed.  Token files are
# read only with mode 0600 or stricter; a refused file or a wrong token gives an error that
# does not show the token but says what failed: authentication (401) or permission (403),
# with the URL and where the token came from.  (tests/cli/hearth_slurmrest.sh does the same against a real
# slurmrestd.)
set -u
cd "$(dirname "$0")/../.."
. tests/cli/lib.sh
. tests/cli/hearth_common.bash
hearth_tmp secrets
make_trainer
unset HEARTH_SLURMREST_URL HEARTH_SLURMREST_TOKEN_FILE SLURM_JWT
export HEARTH_SLURM_POLL_MS=200

tap_plan 9

TOKEN=$(head -c 30 /dev/urandom | base64 | tr -d '/+=' | head -c 40)
OTHER=$(head -c 30 /dev/urandom | base64 | tr -d '/+=' | head -c 40)
DENIED=$(head -c 30 /dev/urandom | base64 | tr -d '/+=' | head -c 40)
# Only the stand-in knows the token from its environment (hearth passes its own on to jobs).
MOCK_TOKEN=$TOKEN MOCK_FORBIDDEN_TOKEN=$DENIED python3 "$ROOT/tests/cli/mock_slurmrestd.py" "$T/mock.port" "$T/mock.log" 2>"$T/mock.err" &
MOCK_PID=$!
trap 'kill "$MOCK_PID" 2>/dev/null; wait "$MOCK_PID" 2>/dev/null; hearth_cleanup' EXIT
wait_for 20 test -s "$T/mock.port" || { echo "1..1"; echo "not ok 1 - the slurmrestd stand-in started"; cat mock.err; exit 1; }
URL=http://127.0.0.1:$(cat mock.port)
( umask 077; printf 'SLURM_JWT=%s\n' "$TOKEN" >token )

# The trainer keeps its whole environment in the run directory, where a leak would show.
cat >envtrainer.sh <<'EOF'
#!/bin/bash
env >"$HEARTH_RUN_DIR/trainer_env.txt"
exec "$(dirname "$0")/trainer.sh" "$@"
EOF
chmod +x envtrainer.sh
spec() {   # spec NAME N
    printf 'name: %s\ntrainer: ./envtrainer.sh\n%s\nmatrix:\n  train.seed: [%s]\n' \
        "$1" "$TINY_BASE" "$(seq -s, 1 "$2")"
}
spec sec-file 2 >a.yaml
spec sec-envfile 1 >b.yaml
spec sec-jwt 2 >c.yaml
spec sec-detach 1 >d.yaml

run_h a submit a.yaml --backend slurmrest --rest-url "$URL" --rest-token-file "$T/token"
HEARTH_SLURMREST_TOKEN_FILE=$T/token HEARTH_SLURMREST_URL=$URL run_h b submit b.yaml --backend slurmrest
SLURM_JWT=$TOKEN HEARTH_SLURMREST_URL=$URL run_h c submit c.yaml --backend slurmrest
SLURM_JWT=$TOKEN HEARTH_SLURMREST_URL=$URL run_h d submit d.yaml --backend slurmrest --detach
run_h dw wait sec-detach
run_h st status
run_h show show sec-jwt-1

sweeps_ok() {
    local n
    for n in a b c d dw; do rc_is "$n" 0 || return 1; done
    [ "$(sql "select count(*) from runs where state = 'completed' and backend = 'slurmrest'")" = 6 ] ||
        { sql "select run_id, state, backend from runs"; cat mock.err; return 1; }
    [ "$(ls runs/*/*/trainer_env.txt | wc -l)" = 6 ] || { echo "trainer environments missing"; return 1; }
}
tap_check "6 runs through the slurmrest stand-in (token from option, file variable, SLURM_JWT, detached): completed" sweeps_ok

sent_ok() {
    local n ok
    n=$(wc -l <mock.log)
    ok=$(python3 -c '
import json, sys
tok = sys.argv[1]
reqs = [json.loads(l) for l in open(sys.argv[2])]
print(sum(r["headers"].get("X-SLURM-USER-TOKEN") == tok and tok not in r["body"]
          and tok not in r["path"] for r in reqs))' "$TOKEN" mock.log)
    [ "$n" -ge 12 ] && [ "$ok" = "$n" ] || { echo "$ok of $n requests carry the token in the header only"; return 1; }
    grep -q '"POST", "path": "/slurm/v0.0.38/job/submit"' mock.log || return 1
}
tap_check "every request carries the token as X-SLURM-USER-TOKEN, none in a body or path" sent_ok

nowhere_ok() {
    local hits
    hits=$(grep -rlF -- "$TOKEN" runs)
    [ -z "$hits" ] || { echo "token in: $hits"; return 1; }
    grep -q '^HEARTH_RUN_ID=' runs/sec-jwt/sec-jwt-1/trainer_env.txt || { echo "no environment dump"; return 1; }
    ! grep -q '^SLURM_JWT=\|^HEARTH_SLURMREST_' runs/*/*/trainer_env.txt || { echo "token variables in a job's environment"; return 1; }
    [ -s runs/sec-detach/runner.log ] && [ -s runs/sec-jwt/sec-jwt-1/job.sh ] || { echo "no runner log or job script"; return 1; }
    sqlite3 -cmd '.timeout 10000' h.db .dump >dump.sql && [ -s dump.sql ] || { echo "no dump"; return 1; }
    ! grep -qF -- "$TOKEN" dump.sql || { echo "token in the database"; return 1; }
    ! grep -lF -- "$TOKEN" ./*.out ./*.err || { echo "token in hearth's output"; return 1; }
}
tap_check "the token is in no file under runs/ (job scripts, logs, job environments), not in the database or hearth's output" nowhere_ok

# Token file modes: 0600 and 0400 are read, anything wider (group, others, owner execute)
# is refused before any request.
modes_ok() {
    local m before rc
    for m in 644 640 604 700 660 2600; do
        cp token "loose$m" && chmod "$m" "loose$m"
        before=$(wc -l <mock.log)
        run_h "mode$m" submit a.yaml --backend slurmrest --rest-url "$URL" --rest-token-file "$T/loose$m"
        rc_is "mode$m" 2 || return 1
        grep -q "loose$m has mode $(printf '%04o' $((8#$m))): .*0600 or stricter.*chmod 600" "mode$m.err" ||
            { echo "mode $m:"; sed "s/$TOKEN/<token>/g" "mode$m.err"; return 1; }
        ! grep -qF -- "$TOKEN" "mode$m.err" "mode$m.out" || { echo "token in the message"; return 1; }
        [ "$(wc -l <mock.log)" = "$before" ] || { echo "mode $m: a request was sent"; return 1; }
    done
    cp token strict400 && chmod 400 strict400
    run_h mode400 submit a.yaml --backend slurmrest --rest-url "$URL" --rest-token-file "$T/strict400"
    rc_is mode400 0
}
tap_check "token files wider than 0600 (0644, 0640, 0604, 0700, 0660, 2600) refused (exit 2, no request); 0400 read" modes_ok

# A FIFO as the token file is refused, not waited on (timeout: it once blocked forever); a
# token file over 8 KiB is refused whole, not cut to its first 8 KiB and sent.
odd_ok() {
    local before
    before=$(wc -l <mock.log)
    mkfifo tokfifo && chmod 600 tokfifo
    timeout 60 "$HEARTH_ABS" --db "$T/h.db" submit a.yaml --backend slurmrest --rest-url "$URL" \
        --rest-token-file "$T/tokfifo" >fifo.out 2>fifo.err
    echo $? >fifo.rc
    rc_is fifo 2 && grep -q "token file: $T/tokfifo: not a regular file (a FIFO)" fifo.err ||
        { cat fifo.err; return 1; }
    ( umask 077; printf 'SLURM_JWT=%s' "$TOKEN" >big; head -c 9000 /dev/zero | tr '\0' ' ' >>big )
    run_h big submit a.yaml --backend slurmrest --rest-url "$URL" --rest-token-file "$T/big"
    rc_is big 2 && grep -Eq "token file: $T/big: 90[0-9]{2} bytes, over the limit of 8 KiB" big.err ||
        { cat big.err; return 1; }
    ! grep -qF -- "$TOKEN" fifo.err fifo.out big.err big.out || { echo "token in the message"; return 1; }
    [ "$(wc -l <mock.log)" = "$before" ] || { echo "a request was sent"; return 1; }
}
tap_check "a FIFO or an oversize token file: refused (exit 2, no request), named, no token shown" odd_ok

# A wrong token (file and variable): the server refuses, the message names no token.
wrong_ok() {
    ( umask 077; echo "$OTHER" >wrong )
    spec sec-wrong 1 >w.yaml
    run_h w1 submit w.yaml --backend slurmrest --rest-url "$URL" --rest-token-file "$T/wrong"
    SLURM_JWT=$OTHER run_h w2 submit w.yaml --backend slurmrest --rest-url "$URL"
    [ "$(cat w1.rc)" != 0 ] && [ "$(cat w2.rc)" != 0 ] || { echo "a wrong token was accepted"; return 1; }
    grep -q "authentication failed (HTTP 401 from $URL).*token from file $T/wrong .*valid and unexpired" w1.err ||
        { cat w1.err; return 1; }
    grep -q "authentication failed (HTTP 401 from $URL).*token from \$SLURM_JWT " w2.err ||
        { cat w2.err; return 1; }
    ! grep -q 'none of the API versions' w1.err w2.err || return 1
    ! grep -F -e "$OTHER" -e "$TOKEN" w1.out w1.err w2.out w2.err || return 1
    ! grep -rlF -e "$OTHER" runs || return 1
}
tap_check "a wrong token (file, SLURM_JWT): HTTP 401 said as an authentication failure naming the URL and the token's source, not the token" wrong_ok

# A token the server knows, of a user that may do nothing: permission denied, not a bad token.
denied_ok() {
    ( umask 077; echo "$DENIED" >denied )
    spec sec-denied 1 >dn.yaml
    run_h dn1 submit dn.yaml --backend slurmrest --rest-url "$URL" --rest-token-file "$T/denied"
    SLURM_JWT=$DENIED run_h dn2 submit dn.yaml --backend slurmrest --rest-url "$URL"
    [ "$(cat dn1.rc)" != 0 ] && [ "$(cat dn2.rc)" != 0 ] || { echo "a denied user's sweep ran"; return 1; }
    grep -q "permission denied (HTTP 403 from $URL).*Access denied.*token from file $T/denied" dn1.err ||
        { cat dn1.err; return 1; }
    grep -q "permission denied (HTTP 403 from $URL).*token from \$SLURM_JWT" dn2.err || { cat dn2.err; return 1; }
    ! grep -q 'authentication failed' dn1.err dn2.err || return 1
    ! grep -F -e "$DENIED" dn1.out dn1.err dn2.out dn2.err || return 1
}
tap_check "a token whose user may not submit: HTTP 403 said as permission denied, with the URL and the token's source, not the token" denied_ok

# No token at all; a bad one in SLURM_JWT.
notoken_ok() {
    run_h nt submit a.yaml --backend slurmrest --rest-url "$URL"
    rc_is nt 2 && grep -q 'needs a token.*SLURM_JWT' nt.err || { cat nt.err; return 1; }
    SLURM_JWT="two words" run_h bt submit a.yaml --backend slurmrest --rest-url "$URL"
    rc_is bt 2 && grep -q 'SLURM_JWT: expected one token' bt.err || { cat bt.err; return 1; }
    ! grep -q 'two words' bt.err
}
tap_check "no token: usage error naming SLURM_JWT; a malformed SLURM_JWT: error without its value" notoken_ok

# The token file wins over SLURM_JWT (a stale variable does not override the file).
prec_ok() {
    spec sec-prec 1 >p.yaml
    SLURM_JWT=$OTHER run_h prec submit p.yaml --backend slurmrest --rest-url "$URL" --rest-token-file "$T/token"
    rc_is prec 0
}
tap_check "--rest-token-file takes precedence over SLURM_JWT" prec_ok
tap_check "database integrity" bash -c "[ \"\$(sqlite3 $T/h.db 'pragma integrity_check')\" = ok ]"
