#!/usr/bin/env bash
# The build's layering (Makefile, "Include paths per layer"): each library is compiled
# with the include paths of the layers it may use only, so that an include of a layer
# above it fails to compile.  For each layer, a file of it is compiled (make -n prints
# the command, so the flags are the build's own) with one allowed and one forbidden
# include added: the allowed one must compile, the forbidden one must not.
set -u
cd "$(dirname "$0")/../.."
. tests/cli/lib.sh
BUILD=${BUILD:-build}

# LAYER FILE ALLOWED FORBIDDEN...
cases=(
    "kernels|kernels/kdev.c|kerr.h|shape/err.h model/internal.h train.h db.h"
    "shape|trainer/shape/run_config.c|shape/err.h|model/internal.h comm/comm.h train.h db.h"
    "comm|trainer/comm/comm.c|shape/err.h|model/internal.h train.h db.h"
    "model|trainer/model/model.c|comm/comm.h|parallel/param_sync.h train.h db.h"
    "trainer|trainer/train.c|model/model.h|db.h spec.h"
    "orchestrator|orchestrator/cli.c|shape/err.h|model/internal.h comm/comm.h train.h"
)
tap_plan ${#cases[@]}

# the -I and -isystem flags of FILE's compile command
flags() {
    make -s -n -B "$BUILD/obj/${1%.c}.o" 2>/dev/null | grep -- " -c $1 " | tr ' ' '\n' |
        awk 'skip { print; skip = 0; next } /^-isystem$/ { print; skip = 1; next } /^-I/'
}

for c in "${cases[@]}"; do
    IFS='|' read -r layer file allowed forbidden <<<"$c"
    mapfile -t f < <(flags "$file")
    check() {
        [ ${#f[@]} -gt 0 ] || { echo "no compile command for $file"; return 1; }
        printf '#include "%s"\n' "$allowed" | cc -std=c11 -fsyntax-only "${f[@]}" -x c - \
            2>&1 || { echo "the allowed $allowed does not compile"; return 1; }
        local h
        for h in $forbidden; do
            if printf '#include "%s"\n' "$h" |
                cc -std=c11 -fsyntax-only "${f[@]}" -x c - >/dev/null 2>&1; then
                echo "$h compiles in the $layer layer (flags: ${f[*]})"
                return 1
            fi
        done
    }
    tap_check "$layer: $allowed compiles, not $forbidden" check
done
