#!/usr/bin/env bash
# Generated shell completion and manual pages: every command and option that `hearth
# --help` / `hearth CMD --help` list (both printed from the command table) is in the bash
# and zsh scripts and in hearth(1); bash completes commands, options, option choices and
# subcommand words; every option of `hearth-train --help` is in hearth-train(1);
# hearth-spec(5) documents every key; groff renders the three pages without a warning.
set -u
cd "$(dirname "$0")/../.."
. tests/cli/lib.sh
. tests/cli/hearth_common.bash
hearth_tmp doc

tap_plan 9

"$HEARTH_ABS" completion bash >c.bash
"$HEARTH_ABS" completion zsh >c.zsh
for p in hearth hearth-train hearth-spec; do "$HEARTH_ABS" man "$p" >"$p.man"; done

# The commands and, per command, the options as --help lists them.
"$HEARTH_ABS" --help | sed -n '/^commands:/,/^$/p' | awk 'NF > 1 { print $1 }' >commands.txt
# roff_dashes --dry-run: \-\-dry\-run, as the pages write an option.
roff_dashes() { sed 's/-/\\-/g' <<<"$1"; }
opts_of() {
    "$HEARTH_ABS" "$1" --help | sed -n '/^options:/,/^$/p' | grep -oE -- '^  (-[a-z], |    )--[a-z0-9-]+' |
        grep -oE -- '--[a-z0-9-]+' | sort -u
}

cmds_ok() {
    [ "$(wc -l <commands.txt)" -ge 18 ] || { echo "only $(wc -l <commands.txt) commands parsed"; return 1; }
    local c
    while read -r c; do
        grep -q "^    $c)$" c.bash || { echo "bash: no case for $c"; return 1; }
        grep -q "^        '$c:" c.zsh || { echo "zsh: $c not described"; return 1; }
        grep -q "^        $c)$" c.zsh || { echo "zsh: no case for $c"; return 1; }
        grep -q "^\.SS \"hearth $c " hearth.man || { echo "hearth(1): no section for $c"; return 1; }
    done <commands.txt
}
tap_check "every command of the table: bash, zsh and hearth(1)" cmds_ok

opts_ok() {
    local c o
    while read -r c; do
        local arm; arm=$(sed -n "/^    $c)$/,/esac ;;/p" c.bash)
        local zarm; zarm=$(sed -n "/^        $c)$/,/&& ret=0 ;;/p" c.zsh)
        local sect; sect=$(sed -n "/^\.SS \"hearth $c /,/^\.SS /p" hearth.man)
        for o in $(opts_of "$c"); do
            grep -q -- " $o" <<<"$arm" || { echo "bash: $c lacks $o"; return 1; }
            grep -q -- "'$o\[" <<<"$zarm" || { echo "zsh: $c lacks $o"; return 1; }
            grep -qF -- "\\fB$(roff_dashes "$o")\\fR" <<<"$sect" || { echo "hearth(1): $c lacks $o"; return 1; }
        done
    done <commands.txt
}
tap_check "every option of every command: bash, zsh and hearth(1)" opts_ok

# comp WORDS...: runs the bash completion for the command line WORDS (the last one being
# completed) and prints the candidates, one a line.
comp() {
    bash -c '. ./c.bash; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); _hearth; printf "%s\n" "${COMPREPLY[@]}"' \
        _ "$@"
}
bash_ok() {
    bash -n c.bash || return 1
    comp hearth su | grep -qx submit || { echo "hearth su<TAB>"; comp hearth su; return 1; }
    comp hearth --db x.db rep | grep -qx report || { echo "after --db FILE"; return 1; }
    [ "$(comp hearth submit --backend '' | sort | tr '\n' ' ')" = "local slurm slurmrest " ] ||
        { echo "--backend choices:"; comp hearth submit --backend ''; return 1; }
    [ "$(comp hearth plan --format '' | sort | tr '\n' ' ')" = "json table " ] ||
        { echo "plan --format choices"; return 1; }
    comp hearth report EXP --sv | grep -qx -- --svg || { echo "report --sv<TAB>"; return 1; }
    [ "$(comp hearth select '' | sort | tr '\n' ' ')" = "encoder fp8 " ] || { echo "select words"; return 1; }
    [ "$(comp hearth man '' | sort | tr '\n' ' ')" = "hearth hearth-spec hearth-train " ] ||
        { echo "man words"; return 1; }
    comp hearth completion '' | grep -qx zsh || return 1
    : >spec-file.yaml
    comp hearth plan spec-f | grep -qx spec-file.yaml || { echo "no file completion"; return 1; }
}
tap_check "bash completes commands, options, choices, words and files" bash_ok

if command -v zsh >/dev/null; then
    tap_check "the zsh script parses (zsh -n)" zsh -n c.zsh
else
    zsh_ok() { grep -q '^#compdef hearth' c.zsh && [ "$(grep -c "'" c.zsh | tr -d ' ')" -gt 0 ] &&
        ! grep -q "[^\\\\]\\\$(" c.zsh; }
    tap_check "the zsh script: #compdef, no command substitution (zsh not installed)" zsh_ok
fi

train_ok() {
    local o n=0
    for o in $("$HEARTH_ABS" man hearth-train >/dev/null && "$ROOT/$HEARTH_TRAIN" --help |
               grep -E '^  +--' | grep -oE -- '^ +--[a-z0-9-]+' | tr -d ' '); do
        n=$((n + 1))
        grep -qF -- "\\fB$(roff_dashes "$o")\\fR" hearth-train.man || { echo "hearth-train(1) lacks $o"; return 1; }
    done
    [ "$n" -ge 6 ] || { echo "only $n options found in hearth-train --help"; return 1; }
    grep -q '^\.SH EXIT STATUS' hearth-train.man && grep -q '^\.SH SYNOPSIS' hearth-train.man
}
tap_check "hearth-train(1) has every option of hearth-train --help" train_ok

spec_ok() {
    ! grep -n 'undocumented' hearth-spec.man || { echo "undocumented keys above"; return 1; }
    local k
    for k in name trainer base resources matrix zip include exclude where repeat retries after \
             nodes gpus_per_node partition setup sbatch retry_timeout pack gpu_mem \
             train.lr parallel.tp model.decoder.heads; do
        grep -qF "\\fB$(sed 's/_/_/g' <<<"$k")\\fR" hearth-spec.man ||
            grep -qF "\\fB$k" hearth-spec.man || { echo "hearth-spec(5) lacks $k"; return 1; }
    done
}
tap_check "hearth-spec(5) documents the spec, resources and run-config keys" spec_ok

if command -v groff >/dev/null; then
    groff_ok() {
        local p out
        for p in hearth hearth-train hearth-spec; do
            out=$(groff -man -Tutf8 -ww -z "$p.man" 2>&1)
            [ -z "$out" ] || { echo "$p: $out"; return 1; }
        done
    }
    tap_check "groff renders the three pages without a warning" groff_ok
else
    tap_skip "groff renders the three pages without a warning" "groff not installed"
fi

if command -v man >/dev/null; then
    man_ok() {
        MANWIDTH=80 man -l hearth.man 2>/dev/null | grep -q 'hearth report EXP' &&
            MANWIDTH=80 man -l hearth-spec.man 2>/dev/null | grep -q 'TOP-LEVEL KEYS'
    }
    tap_check "man -l shows the pages" man_ok
else
    tap_skip "man -l shows the pages" "man-db not installed"
fi

errs_ok() {
    "$HEARTH_ABS" completion fish >/dev/null 2>e1; [ $? = 2 ] && grep -q "unknown shell 'fish'" e1 &&
    { "$HEARTH_ABS" man nope >/dev/null 2>e2; [ $? = 2 ]; } && grep -q "no manual page 'nope'" e2 &&
    { "$HEARTH_ABS" man hearth-train --trainer /bin/false >/dev/null 2>e3; [ $? = 1 ]; } &&
        grep -q "/bin/false --help failed" e3
}
tap_check "unknown shell or page: exit 2; a trainer that fails --help: exit 1" errs_ok
