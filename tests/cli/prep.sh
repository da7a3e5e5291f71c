#!/usr/bin/env bash
# hearth-prep end to end: a few generated PNG and JPEG images and JSONL records are
# prepared into shards, then hearth-train trains tiny-vlm on them (data.kind=shards),
# on one rank and on two (dp 2); bad input fails with exit 2 naming file and line and
# leaves no shard behind; the output does not depend on --jobs.
set -u
cd "$(dirname "$0")/../.."
. tests/cli/lib.sh
HEARTH_PREP="$BUILD/bin/hearth-prep"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/hearth-cli-prep.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# PNGs are written by python3's zlib and struct (no imaging library needed); one JPEG
# (40x24 colour, made once with libjpeg) is embedded below.
tap_plan 9

mkdir -p "$tmp/in/img"
python3 - "$tmp/in/img" <<'PY'
import random, struct, sys, zlib
d = sys.argv[1]
random.seed()
def png(path, w, h):
    rows = b"".join(b"\x00" + bytes(random.randrange(256) for _ in range(3 * w)) for _ in range(h))
    def chunk(t, data):
        return struct.pack(">I", len(data)) + t + data + struct.pack(">I", zlib.crc32(t + data) & 0xffffffff)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))
for i in range(6):
    png(f"{d}/p{i}.png", random.randrange(12, 60), random.randrange(12, 60))
PY
base64 -d >"$tmp/in/img/j0.jpg" <<'B64'
/9j/4AAQSkZJRgABAQAAAQABAAD/2wBDAAgGBgcGBQgHBwcJCQgKDBQNDAsLDBkSEw8UHRofHh0aHBwgJC4nICIsIxwcKDcpLDAx
NDQ0Hyc5PTgyPC4zNDL/2wBDAQkJCQwLDBgNDRgyIRwhMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjIy
MjIyMjIyMjL/wAARCAAYACgDASIAAhEBAxEB/8QAHwAAAQUBAQEBAQEAAAAAAAAAAAECAwQFBgcICQoL/8QAtRAAAgEDAwIEAwUF
BAQAAAF9AQIDAAQRBRIhMUEGE1FhByJxFDKBkaEII0KxwRVS0fAkM2JyggkKFhcYGRolJicoKSo0NTY3ODk6Q0RFRkdISUpTVFVW
V1hZWmNkZWZnaGlqc3R1dnd4eXqDhIWGh4iJipKTlJWWl5iZmqKjpKWmp6ipqrKztLW2t7i5usLDxMXGx8jJytLT1NXW19jZ2uHi
4+Tl5ufo6erx8vP09fb3+Pn6/8QAHwEAAwEBAQEBAQEBAQAAAAAAAAECAwQFBgcICQoL/8QAtREAAgECBAQDBAcFBAQAAQJ3AAEC
AxEEBSExBhJBUQdhcRMiMoEIFEKRobHBCSMzUvAVYnLRChYkNOEl8RcYGRomJygpKjU2Nzg5OkNERUZHSElKU1RVVldYWVpjZGVm
Z2hpanN0dXZ3eHl6goOEhYaHiImKkpOUlZaXmJmaoqOkpaanqKmqsrO0tba3uLm6wsPExcbHyMnK0tPU1dbX2Nna4uPk5ebn6Onq
8vP09fb3+Pn6/9oADAMBAAIRAxEAPwBpgRYhGiI2CFaGOPauNqrhkznGCgxndtdVzulfEgYb2aOQOwcsEOxlLb++PlB3JnJJUkFv
uRKDHs2gu6sqAqwdoS7M3mFx8pwA+9j8oH32VM4SQl2Vez8o4gtWXaV8wEOojGSHY52mNBzjou/HMQBbaTfr939aLRdWiXflafT9
F/l6ydtdxMCe1xCBOxjVo1DP5ag5OBgDjDYxkttcD78pAerNOQHD3FwrjDbQVQg5GckITle2V3Rj+CHBRJ5trxSu0PD/ACsAJHbJ
LArgk5dvugdW8v8A56ktGYkLh3iSQ8FZmPmMOeZMZB3Zfdj+/IR/qxR0aXR/8OvNaX7d2VJK8k/6ei+V/K707bMIWODrEypHw3Bt
wuz1PIG1uuCQpJ+/MACpkiTz1VowsYZgkTQkOyllXbt3Zxny12ZBwVj6mQ0VcakYt3pyl5r1fmjelXqwv7Prvtv22/q5BBawmVoU
DPcbNu4XBZFURtEAHGeg8wZPy58xz8qDc7547s7VDXJIZnWN0CNujO7AIYgFY+p3YEY+/ISCis3Jtyk+y/Nf1bYzStJLyf4Nfd8v
yJiGF2jI5eQHYxXyyEA3gAjO3IBlXrt+91jj5jFwsTNcI8Um9AzvI+F5CsTkDptSPvuACn77gqUU11fp89Xv9223kR1S7L9Xp6ad
AMIjf/REkkAcb5NvII35wuAhJLyYzlS7EfciYkoorCvRjKfK9bd0n+af4HNXrOlKKte6T3fd9mj/2Q==
B64
# 16 records over two files: text tokens < 1023, one 1023 placeholder per image.
python3 - "$tmp/in" <<'PY'
import json, random, sys
d = sys.argv[1]
imgs = [f"img/p{i}.png" for i in range(6)] + ["img/j0.jpg"]
for name, n in (("a.jsonl", 10), ("b.jsonl", 6)):
    with open(f"{d}/{name}", "w") as f:
        for _ in range(n):
            k = random.randrange(0, 3)
            toks = [random.randrange(0, 1000) for _ in range(random.randrange(4, 30))]
            pics = [random.choice(imgs) for _ in range(k)]
            for _ in pics:
                toks.insert(random.randrange(0, len(toks) + 1), 1023)
            f.write(json.dumps({"tokens": toks, "images": pics}) + "\n")
PY

PREP=(--model tiny-vlm --in "$tmp/in/a.jsonl" --in "$tmp/in/b.jsonl" --min-pixels 256
      --max-pixels 2304 --shard-records 5)
"$HEARTH_PREP" "${PREP[@]}" --out "$tmp/ds" -j 2 >"$tmp/prep.out" 2>"$tmp/prep.err"
rc=$?
tap_result $((rc != 0)) "hearth-prep makes the data set" "$(cat "$tmp/prep.err")"
ok=0
[ -f "$tmp/ds/manifest.json" ] && [ "$(ls "$tmp/ds"/shard-*.bin | wc -l)" -eq 4 ] &&
    grep -q '"records": 16' "$tmp/ds/manifest.json" || ok=1
tap_result $ok "4 shards and a manifest of 16 records" "$(ls -la "$tmp/ds"; cat "$tmp/ds/manifest.json")"
grep -q "16/16 records" "$tmp/prep.err"
tap_result $? "progress on stderr" "$(cat "$tmp/prep.err")"

"$HEARTH_PREP" "${PREP[@]}" --out "$tmp/ds1" -j 1 -q 2>"$tmp/prep1.err"
ok=0
for f in "$tmp"/ds/shard-*.bin; do cmp -s "$f" "$tmp/ds1/$(basename "$f")" || ok=1; done
tap_result $ok "the same shards with --jobs 1" "$(cat "$tmp/prep1.err")"

TRAIN=(--set model=tiny-vlm --set data.kind=shards --set data.path="$tmp/ds"
       --set train.seq_len=48 --set train.micro_batch=2 --set train.global_batch=4
       --set train.steps=6 --set train.lr=3e-3 --set train.warmup=1)
# finite_losses FILE: every step's loss is a finite number
finite_losses() {
    [ -f "$1" ] && [ "$(wc -l <"$1")" -eq 6 ] || { echo "no 6 lines in $1"; return 1; }
    ! grep -qiE '"loss": *(null|nan|inf|-inf)' "$1" || { cat "$1"; return 1; }
}
"$HEARTH_TRAIN" "${TRAIN[@]}" --out "$tmp/run1" >"$tmp/run1.out" 2>"$tmp/run1.err"
rc=$?
tap_result $((rc != 0)) "hearth-train on the shards, one rank" "$(tail -5 "$tmp/run1.err")"
out=$(finite_losses "$tmp/run1/metrics.jsonl" 2>&1); tap_result $? "finite losses, one rank" "$out"

"$HEARTH_TRAIN" "${TRAIN[@]}" --set ranks=2 --set parallel.dp=2 --out "$tmp/run2" \
    >"$tmp/run2.out" 2>"$tmp/run2.err"
rc=$?
tap_result $((rc != 0)) "hearth-train on the shards, ranks 2 dp 2" "$(tail -5 "$tmp/run2.err")"
# the same data and model: the dp 2 loss curve equals the single-rank one up to rounding
out=$(python3 - "$tmp/run1/metrics.jsonl" "$tmp/run2/metrics.jsonl" <<'PY'
import json, sys
a = [json.loads(l)["loss"] for l in open(sys.argv[1])]
b = [json.loads(l)["loss"] for l in open(sys.argv[2])]
bad = [(x, y) for x, y in zip(a, b) if abs(x - y) > 1e-4 * max(1.0, abs(x))]
if len(a) != 6 or len(b) != 6 or bad:
    print("losses differ:", a, b); sys.exit(1)
PY
)
tap_result $? "dp 2 gives the single-rank losses" "$out"

# A truncated image: exit 2, the file and line named, no shard left.
head -c 100 "$tmp/in/img/p0.png" >"$tmp/in/img/bad.png"
printf '{"tokens": [1, 2, 3], "images": []}\n{"tokens": [1, 1023], "images": ["img/bad.png"]}\n' \
    >"$tmp/in/bad.jsonl"
"$HEARTH_PREP" --model tiny-vlm --in "$tmp/in/bad.jsonl" --shard-records 1 -q \
    --out "$tmp/bad" 2>"$tmp/bad.err"
rc=$?
ok=0
[ "$rc" -eq 2 ] && grep -q "bad.jsonl:2: images\[0\]: .*bad.png: bad PNG" "$tmp/bad.err" &&
    [ -z "$(ls -A "$tmp/bad" 2>/dev/null)" ] || ok=1
tap_result $ok "a truncated image: exit 2, file and line named, nothing left" \
    "rc $rc: $(cat "$tmp/bad.err"); left: $(ls -A "$tmp/bad" 2>/dev/null)"
