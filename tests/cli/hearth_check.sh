#!/usr/bin/env bash
# hearth check: two experiments of the same two points (2 repeats each) run with the real
# trainer; their timing figures are then set in the database, so that no verdict depends
# on how busy the machine is.  The second passes against the first (history baseline and
# --against), a reference file written from the first passes too; a slowed point fails
# with exit 1 and the table naming the figure, as does a reference with more tokens/s;
# --tol widens the gate; --strict fails on a point without baseline; CSV and JSON carry
# the same verdicts; usage errors exit 2.
set -u
cd "$(dirname "$0")/../.."
. tests/cli/lib.sh
. tests/cli/hearth_common.bash
hearth_tmp check

tap_plan 10

for e in base cand; do
    cat >"$e.yaml" <<EOF
name: $e
$TINY_BASE
matrix:
  train.seed: [1, 2]
repeat: 2
EOF
done
run_h sub1 submit base.yaml --backend local --jobs 2
run_h sub2 submit cand.yaml --backend local --jobs 2

# Deterministic timings: the two repeats of a point (by seed) of an experiment get
# TPS_A and TPS_B tokens/s, and the step time that goes with them.
set_timings() {   # set_timings EXP SEED TPS_A TPS_B
    local ids a b
    ids=$(sql "select r.id from runs r join experiments e on e.id = r.experiment_id
               join run_config_kv kv on kv.run = r.id join config_keys k on k.id = kv.key_id
               where e.name = '$1' and k.key = 'train.seed' and kv.num = $2 order by r.seq")
    a=$(sed -n 1p <<<"$ids"); b=$(sed -n 2p <<<"$ids")
    sql "update results set tokens_per_s = $3, step_ms_median = 1e6 / $3 where run = $a;
         update results set tokens_per_s = $4, step_ms_median = 1e6 / $4 where run = $b"
}
for e in base cand; do
    set_timings $e 1 1000 1020
    set_timings $e 2 1800 1840
done

pass_ok() {
    rc_is sub1 0 && rc_is sub2 0 || return 1
    [ "$(sql "select count(*) from runs where state = 'completed'")" = 8 ] ||
        { echo "want 8 completed runs"; return 1; }
    run_h hist check cand
    rc_is hist 0 || { cat hist.out; return 1; }
    grep -q '^point .* figure .* spread_pct .* baseline .* verdict' hist.out ||
        { echo "no header"; cat hist.out; return 1; }
    # Both points compared with base's runs; the median and spread of the repeats shown.
    [ "$(grep -cE '^train.seed=[12] +tokens_per_s +2 +1[0-9]+ +[0-9.]+ +base +2 .* ok$' hist.out)" = 2 ] ||
        { echo "tokens/s rows:"; cat hist.out; return 1; }
    grep -qE '^train.seed=1 +tokens_per_s +2 +1010 +1.98 +base' hist.out ||
        { echo "median/spread"; cat hist.out; return 1; }
    grep -q '^2 points: 0 figures REGRESSED, 0 points without baseline' hist.out ||
        { cat hist.out; return 1; }
    run_h ag check cand --against base
    rc_is ag 0
}
tap_check "a sweep that matches its predecessor passes (history and --against)" pass_ok

run_h wref check base --write-reference ref.yaml
ref_ok() {
    rc_is wref 0 && grep -q "wrote 2 points of base to ref.yaml" wref.out || return 1
    grep -q '^hearth_reference: 1' ref.yaml && [ "$(grep -c 'config_hash:' ref.yaml)" = 2 ] ||
        { cat ref.yaml; return 1; }
    grep -qE '^    tokens_per_s: 1010$' ref.yaml || { cat ref.yaml; return 1; }
    run_h refck check cand --reference ref.yaml
    rc_is refck 0 && grep -qE '^train.seed=1 +tokens_per_s .* reference .* ok$' refck.out
}
tap_check "--write-reference records the medians; the sweep passes against it" ref_ok

# A reference that expects 20 % more throughput of every point.
python3 - <<'PY'
import re
t = open('ref.yaml').read()
t = re.sub(r'tokens_per_s: ([0-9.]+)',
           lambda m: 'tokens_per_s: %g' % (float(m.group(1)) * 1.2), t)
open('ref_fast.yaml', 'w').write(t)
PY
run_h fast check cand --reference ref_fast.yaml
fast_ok() {
    rc_is fast 1 || { cat fast.out; return 1; }
    [ "$(grep -cE '^train.seed=[12] +tokens_per_s .* REGRESSED$' fast.out)" = 2 ] ||
        { cat fast.out; return 1; }
    grep -qE '^train.seed=1 +step_ms_median .* ok$' fast.out &&
        grep -q '2 figures REGRESSED' fast.out
}
tap_check "a reference with more tokens/s: exit 1, the table names tokens_per_s" fast_ok

# Slow down cand's train.seed=2 point by 10 %: its tokens/s and step time regress.
set_timings cand 2 1620 1656
run_h slow check cand
slow_ok() {
    rc_is slow 1 || { cat slow.out; return 1; }
    grep -qE '^train.seed=2 +tokens_per_s +2 +1638 .* base .* -10 +5 +REGRESSED$' slow.out ||
        { cat slow.out; return 1; }
    grep -qE '^train.seed=2 +step_ms_median .* REGRESSED$' slow.out || return 1
    grep -qE '^train.seed=1 +tokens_per_s .* ok$' slow.out || return 1
    ! grep -qE '^train.seed=[12] +(final_loss|peak_mem_bytes) .* REGRESSED' slow.out
}
tap_check "a slowed point: exit 1, tokens_per_s and step_ms_median REGRESSED" slow_ok

run_h wide check cand --tol tokens_per_s=12,step_ms_median=off
wide_ok() {
    rc_is wide 0 || { cat wide.out; return 1; }
    grep -qE '^train.seed=2 +tokens_per_s .* 12 +ok$' wide.out &&
        grep -qE '^train.seed=2 +step_ms_median .* ungated$' wide.out
}
tap_check "--tol widens one figure's gate and turns another off" wide_ok

run_h csv check cand --format csv
run_h json check cand --format json
formats_ok() {
    rc_is csv 1 && rc_is json 1 || return 1
    head -1 csv.out | grep -q '^point,figure,runs,median,spread_pct,baseline,base_runs,base_median,base_spread_pct,change_pct,tol_pct,verdict,config_hash,min,max,base_min,base_max$' ||
        { head -1 csv.out; return 1; }
    grep -q '^train.seed=2,tokens_per_s,2,1638,.*,REGRESSED,' csv.out || { cat csv.out; return 1; }
    grep -q 'REGRESSED' csv.err || { echo "summary not on stderr"; return 1; }
    python3 - <<'PY'
import json
rows = json.load(open('json.out'))
bad = [(r['point'], r['figure']) for r in rows if r['verdict'] == 'REGRESSED']
assert sorted(bad) == [('train.seed=2', 'step_ms_median'), ('train.seed=2', 'tokens_per_s')], bad
r = [r for r in rows if r['point'] == 'train.seed=2' and r['figure'] == 'tokens_per_s'][0]
assert (r['median'], r['min'], r['max'], r['base_median']) == (1638, 1620, 1656, 1820), r
assert abs(r['change_pct'] + 10) < 1e-9 and r['tol_pct'] == 5, r
assert len(r['config_hash']) == 64, r
PY
}
tap_check "CSV and JSON: the same verdicts, min/max and the hash; the summary on stderr" formats_ok

# A third experiment with a point that no experiment ran before.
cat >new.yaml <<EOF
name: new
$TINY_BASE
matrix:
  train.seed: [1, 3]
EOF
run_h sub3 submit new.yaml --backend local --jobs 2
run_h lax check new --figures final_loss,peak_mem_bytes
run_h strict check new --figures final_loss,peak_mem_bytes --strict
strict_ok() {
    rc_is sub3 0 && rc_is lax 0 || { cat lax.out; return 1; }
    grep -qE '^train.seed=3 +final_loss .* no baseline$' lax.out || { cat lax.out; return 1; }
    ! grep -q 'tokens_per_s' lax.out || { echo "--figures not honoured"; return 1; }
    grep -q '1 point without baseline' lax.out && rc_is strict 1
}
tap_check "a point without baseline: reported, exit 0; with --strict exit 1" strict_ok

# A reference point that the sweep lacks is "not run" (a failure only with --strict).
printf 'hearth_reference: 1\npoints:\n  - {config_hash: "%064d", label: gone, tokens_per_s: 5}\n' 0 >gone.yaml
run_h gone check base --reference gone.yaml
run_h gone_strict check base --reference gone.yaml --strict
gone_ok() {
    rc_is gone 0 && grep -qE '^gone +.* not run$' gone.out && rc_is gone_strict 1
}
tap_check "a reference point not in the sweep: not run; --strict fails" gone_ok

usage_ok() {
    run_h u1 check cand --tol tps=5
    rc_is u1 2 && grep -q "unknown figure 'tps'" u1.err || return 1
    run_h u2 check cand --against base --reference ref.yaml
    rc_is u2 2 && grep -q "give one baseline" u2.err || return 1
    run_h u3 check nosuch
    rc_is u3 2 && grep -q "no experiment named 'nosuch'" u3.err || return 1
    run_h u4 check cand --against nosuch
    rc_is u4 2 && grep -q "no experiment named 'nosuch'" u4.err || return 1
    printf 'hearth_reference: 1\npoints:\n  - config_hash: xyz\n' >bad.yaml
    run_h u5 check cand --reference bad.yaml
    rc_is u5 2 && grep -q "bad.yaml:3:18: config_hash" u5.err || return 1
    run_h u6 check cand --reference missing.yaml
    rc_is u6 1 && grep -q "missing.yaml" u6.err || return 1
    run_h u7 check cand --write-reference x.yaml --tol mfu=3
    rc_is u7 2 && [ ! -e x.yaml ]
}
tap_check "usage errors exit 2 with the cause; an unreadable reference exits 1" usage_ok

help_ok() {
    h check --help | grep -q -- '--write-reference FILE' && h --help | grep -qE '^  check EXP '
}
tap_check "hearth check --help and hearth --help list the command" help_ok
