#!/usr/bin/env bash
# hearth report: a small local sweep (2 configs of 1 and 2 ranks, 2 repeats each) and a
# recorded selection decision drawn as SVG and HTML; the SVG is well-formed XML
# (xmllint), Chromium renders it to a PNG that is not blank, rsvg-convert renders it to a
# PNG where each config has one colour in every panel, the HTML is self-contained;
# --runs picks the loss curves; clear errors for an unknown experiment, one without
# completed runs and runs without metrics; a failed report leaves no file behind and
# does not touch an older one.
set -u
cd "$(dirname "$0")/../.."
. tests/cli/lib.sh
. tests/cli/hearth_common.bash
hearth_tmp report

tap_plan 14

cat >s.yaml <<EOF
name: rep
base:
  model: tiny-vlm
  train: {steps: 3, seq_len: 32, micro_batch: 1, global_batch: 2, warmup: 0, measure_from: 1}
  data: {images_min: 1, images_max: 1, image_px_min: 16, image_px_max: 16}
zip:
  - {ranks: [1, 2], parallel.tp: [1, 2]}
repeat: 2
EOF
run_h sub submit s.yaml --backend local --jobs 2
# A decision of the experiment whose evidence holds markup characters.
sql "insert into decisions (kind, experiment, subject, decision, method, evidence)
     values ('encoder', 'rep', '{\"model\":\"tiny-vlm\"}', '{\"tp\":2}', 'measured',
             '{\"ranked\":[{\"tp\":2,\"note\":\"<b>&amp; \\\"q\\\"</b>\"}]}')"

run_h rep report rep --svg r.svg --html r.html
rep_ok() {
    rc_is sub 0 && rc_is rep 0 || return 1
    [ -s r.svg ] && [ -s r.html ] || { echo "no report files"; return 1; }
    local want
    for want in 'Throughput per config' 'Scaling: tokens/s over ranks' 'Loss per step' \
                'Selection decisions' 'ranks=1' 'ranks=2' '&lt;b&gt;&amp;amp;'; do
        grep -qF -- "$want" r.svg || { echo "r.svg lacks: $want"; return 1; }
    done
    # Default curves: the best 5 of the 4 runs = all of them.
    for want in rep-1 rep-2 rep-3 rep-4; do
        grep -q "$want " r.svg || { echo "r.svg lacks the curve of $want"; return 1; }
    done
    [ "$(grep -c '<polyline' r.svg)" = 4 ] || { echo "want 4 loss curves"; return 1; }
}
tap_check "report --svg --html: throughput, scaling, loss curves, decision" rep_ok

if command -v xmllint >/dev/null; then
    tap_check "the SVG is well-formed XML" xmllint --noout r.svg
else
    tap_skip "the SVG is well-formed XML" "xmllint not installed (libxml2-utils)"
fi

html_ok() {
    grep -q '^<!DOCTYPE html>' r.html && grep -q '<svg xmlns=' r.html || return 1
    # Self-contained: nothing loaded from elsewhere.
    ! grep -qiE '<(script|link|img)|src=|url\(' r.html || { echo "external references"; return 1; }
    grep -qF '&lt;b&gt;&amp;amp; \&quot;q\&quot;&lt;/b&gt;' r.html ||
        { echo "evidence not escaped in full"; grep -n 'ranked' r.html; return 1; }
    [ "$(grep -c '^<tr><td>C[0-9]' r.html)" = 2 ] || { echo "want 2 config rows"; return 1; }
}
tap_check "the HTML page: self-contained, the SVG inline, configs and evidence" html_ok

# Python that reads a PNG (8-bit RGB or RGBA, non-interlaced: what Chromium and
# rsvg-convert write) with the standard library only: read_png(path) gives
# (width, height, bytes per pixel, rows of bytes).
PNG_READ='
import struct, sys, zlib
def read_png(path):
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, w = 8, b"", 0
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            w, h, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and ctype in (2, 6) and not interlace, "unsupported PNG"
            bpp = 3 if ctype == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw, stride, prev, rows, i = zlib.decompress(idat), w * bpp, None, [], 0
    for _ in range(h):
        f, line = raw[i], bytearray(raw[i + 1:i + 1 + stride])
        i += 1 + stride
        for x in range(stride):
            a = line[x - bpp] if x >= bpp else 0
            b = prev[x] if prev else 0
            c = prev[x - bpp] if prev and x >= bpp else 0
            if f == 1: line[x] = (line[x] + a) & 255
            elif f == 2: line[x] = (line[x] + b) & 255
            elif f == 3: line[x] = (line[x] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c; pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(line)
        prev = line
    return w, h, bpp, rows
'

# Counts the distinct colours of a PNG.
png_colours() {
    python3 -c "$PNG_READ"'
w, h, bpp, rows = read_png(sys.argv[1])
print(len({bytes(r[k:k + bpp]) for r in rows for k in range(0, w * bpp, bpp)}))
' "$1"
}

# Samples the picture PNG of report SVG at each config's shapes (class "config Cn": its
# bar and legend swatch, its scaling point, its runs' loss curves and their legend
# markers) and checks each config has one colour everywhere, the one its bar is filled
# with, and no two configs share one.
png_config_colours() {
    python3 -c "$PNG_READ"'
import xml.etree.ElementTree as ET
ns = "{http://www.w3.org/2000/svg}"
w, h, bpp, rows = read_png(sys.argv[2])
def at(x, y):
    r = rows[int(y)]; k = int(x) * bpp
    return "#%02x%02x%02x" % tuple(r[k:k + 3])
def centre(e):
    if e.tag == ns + "circle":
        return float(e.get("cx")), float(e.get("cy"))
    pts = [tuple(map(float, p.split(","))) for p in e.get("points").split()]
    return sum(p[0] for p in pts) / len(pts), sum(p[1] for p in pts) / len(pts)
want, points = {}, []
for g in ET.parse(sys.argv[1]).iter(ns + "g"):
    cls = g.get("class", "").split()
    if cls[:1] != ["config"]:
        continue
    name, n = cls[1], len(points)
    for e in g:
        if e.tag == ns + "rect":
            x, y, rw, rh = (float(e.get(a)) for a in ("x", "y", "width", "height"))
            want.setdefault(name, e.get("fill"))
            points.append((name,) + ((x + 0.15 * rw, y + 0.5 * rh) if rh > 12 else (x + 1.2, y + 1.2)))
            break
        if e.tag in (ns + "circle", ns + "polygon") and e.get("fill") != "#ffffff":
            points.append((name,) + centre(e))
            break
    assert len(points) > n, "no shape to sample in " + name
# Runs of equal losses draw their curves on top of each other: a point that a later
# shape of another config covers is not sampled.
seen = {}
for i, (name, x, y) in enumerate(points):
    if not any(o != name and abs(ox - x) < 8 and abs(oy - y) < 8 for o, ox, oy in points[i + 1:]):
        seen.setdefault(name, []).append(at(x, y))
ok = len(seen) >= 2
for name, got in sorted(seen.items()):
    if set(got) != {want.get(name)}:
        print("%s: colours %s in the picture, its bar is %s" % (name, got, want.get(name))); ok = False
if len(set(want.values())) != len(want):
    print("two configs share a colour:", want); ok = False
print("%d configs sampled at %d places" % (len(seen), sum(map(len, seen.values()))))
sys.exit(0 if ok else 1)
' "$1" "$2"
}

chromium_bin=$(command -v chromium || command -v chromium-browser || true)
render_ok() {
    timeout 120 "$chromium_bin" --headless --no-sandbox --disable-gpu --hide-scrollbars \
        --window-size=960,1300 --screenshot="$T/r.png" "file://$T/r.svg" >chromium.log 2>&1 ||
        { echo "chromium failed:"; tail -5 chromium.log; return 1; }
    local n; n=$(png_colours r.png) || return 1
    # A blank page has 1 colour; the bars, lines and anti-aliased text give hundreds.
    [ "$n" -ge 50 ] || { echo "the rendered report has only $n colours"; return 1; }
    # And the checker itself tells a blank image apart: render an empty SVG.
    echo '<svg xmlns="http://www.w3.org/2000/svg" width="200" height="100"/>' >blank.svg
    timeout 120 "$chromium_bin" --headless --no-sandbox --disable-gpu --hide-scrollbars \
        --window-size=200,100 --screenshot="$T/blank.png" "file://$T/blank.svg" >/dev/null 2>&1
    [ "$(png_colours blank.png)" -le 2 ] || { echo "a blank page counts as not blank"; return 1; }
}
if [ -n "$chromium_bin" ]; then
    tap_check "Chromium renders the SVG to a PNG that is not blank" render_ok
else
    tap_skip "Chromium renders the SVG to a PNG that is not blank" "chromium not installed"
fi

# The charts agree with themselves: a config's colour is the same in every panel (the
# loss curves come best run first, not in config order); ranks and steps have whole-number
# ticks; one ideal-scaling line, from the config of 1 rank (both configs share every
# setting but the layout); the bars say what varies.
consistent_ok() {
    rsvg-convert -o r-rsvg.png r.svg 2>rsvg.err && [ ! -s rsvg.err ] ||
        { echo "rsvg-convert failed:"; cat rsvg.err; return 1; }
    png_config_colours r.svg r-rsvg.png || return 1
    ! grep -qE '>[0-9]+\.5</text>' r.svg || { echo "a tick between whole numbers"; return 1; }
    [ "$(grep -c '<g class="ideal ' r.svg)" = 1 ] && grep -q '<g class="ideal C1">' r.svg ||
        { echo "want one ideal line, from C1"; grep '"ideal' r.svg; return 1; }
    grep -qE '>[^<]*tp=1 ranks=1</text>' r.svg ||
        { echo "no short label under C1's bar"; return 1; }
}
if command -v rsvg-convert >/dev/null; then
    tap_check "rsvg-convert: one colour per config in every panel, whole ticks, ideal line" consistent_ok
else
    tap_skip "rsvg-convert: one colour per config in every panel, whole ticks, ideal line" \
        "rsvg-convert not installed (librsvg2-bin)"
fi

run_h runs report rep --runs rep-2,rep-3 --svg picked.svg
runs_ok() {
    rc_is runs 0 || return 1
    [ "$(grep -c '<polyline' picked.svg)" = 2 ] || { echo "want 2 curves"; return 1; }
    grep -q 'rep-2 ' picked.svg && grep -q 'rep-3 ' picked.svg && ! grep -q 'rep-1 ' picked.svg
}
tap_check "--runs ID,ID draws exactly those runs' loss curves" runs_ok

run_h best report rep --best 1 --svg best.svg
best_ok() {
    rc_is best 0 || return 1
    local top; top=$(sql "select r.run_id from runs r join results x on x.run = r.id
                          order by x.tokens_per_s desc limit 1")
    [ "$(grep -c '<polyline' best.svg)" = 1 ] && grep -q "$top " best.svg ||
        { echo "want only the curve of $top"; return 1; }
}
tap_check "--best 1: the curve of the run with the most tokens/s" best_ok

cp r.svg r.svg.before
run_h unknown report nosuch --svg r.svg
unknown_ok() {
    rc_is unknown 2 && grep -q "no experiment named 'nosuch'" unknown.err &&
        cmp -s r.svg r.svg.before
}
tap_check "unknown experiment: exit 2, named; the older report untouched" unknown_ok

sql "insert into experiments (name) values ('empty')"
run_h empty report empty --html e.html
empty_ok() { rc_is empty 2 && grep -q "experiment 'empty' has no completed run" empty.err && [ ! -e e.html ]; }
tap_check "experiment without completed runs: a clear error, no file" empty_ok

run_h badrun report rep --runs rep-1,rep-9 --svg x.svg
badrun_ok() { rc_is badrun 2 && grep -q "no run named 'rep-9'" badrun.err && [ ! -e x.svg ]; }
tap_check "--runs naming a missing run: exit 2, named" badrun_ok

sql "delete from metrics where run = (select id from runs where run_id = 'rep-3')"
run_h nomet report rep --runs rep-3 --svg x.svg
nomet_ok() { rc_is nomet 2 && grep -q "run 'rep-3' has no per-step losses" nomet.err && [ ! -e x.svg ]; }
tap_check "a chosen run without metrics: exit 2, named" nomet_ok

sql "delete from metrics"
run_h allnomet report rep --svg x.svg
allnomet_ok() { rc_is allnomet 2 && grep -q "empty metrics" allnomet.err && [ ! -e x.svg ]; }
tap_check "no metrics at all: exit 2, says so" allnomet_ok

run_h nodir report rep --svg no/such/dir/x.svg --runs rep-1
nodir_ok() {
    # rep-1 still has no metrics either: first put one run's metrics back.
    rc_is nodir 2 || return 1
    sql "insert into metrics (run, step, loss) select id, 1, 5.0 from runs where run_id = 'rep-1'"
    run_h nodir2 report rep --svg no/such/dir/x.svg --runs rep-1
    rc_is nodir2 1 && grep -q "no/such/dir" nodir2.err && [ ! -e no ] &&
        [ -z "$(find . -name '.*.tmp')" ]
}
tap_check "an unwritable path: exit 1, nothing left behind" nodir_ok

run_h none report rep
none_ok() { rc_is none 2 && grep -q "nothing to write" none.err; }
tap_check "report without --svg or --html: exit 2" none_ok
