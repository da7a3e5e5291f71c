# TAP helpers for shell tests.  Source it, call `tap_plan N`, then `tap_ok COND-EXIT NAME`
# (or `tap_check NAME CMD...`), `tap_skip NAME WHY`.  BUILD points at the build dir.
BUILD=${BUILD:-build}
HEARTH_TRAIN="$BUILD/bin/hearth-train"
HEARTH="$BUILD/bin/hearth"
_tap_n=0
tap_plan() { echo "1..$1"; }
tap_result() {   # tap_result STATUS NAME [DIAGNOSTIC]
    _tap_n=$((_tap_n + 1))
    if [ "$1" -eq 0 ]; then echo "ok $_tap_n - $2"
    else echo "not ok $_tap_n - $2"; [ -n "${3:-}" ] && printf '%s\n' "$3" | sed 's/^/# /'
    fi
    return 0
}
tap_check() {    # tap_check NAME CMD...: passes when CMD exits 0
    local name=$1; shift
    local out; out=$("$@" 2>&1); tap_result $? "$name" "$out"
}
tap_skip() { _tap_n=$((_tap_n + 1)); echo "not ok $_tap_n # SKIP $1: $2"; }
