#!/usr/bin/env bash
# Runs a command, passing its output (stdout and stderr, merged) through,
# and prints "... NAME: still running, Ns" whenever the command has printed
# nothing for PROGRESS_TICK seconds (default 30), so that a long silent step
# (a Go build of the library, a fuzz target) still shows it is alive.
# Exits with the command's status.
#   scripts/progress.sh NAME COMMAND [ARG...]
set -uo pipefail
name=$1
shift
tick=${PROGRESS_TICK:-30}
t0=$SECONDS
"$@" 2>&1 | {
    quiet=0
    while :; do
        line=
        if IFS= read -r -t 1 line; then
            printf '%s\n' "$line"
            quiet=0
        elif [ $? -gt 128 ]; then # no complete line within 1 s
            [ -n "$line" ] && printf '%s' "$line" # a partial line: keep it
            quiet=$((quiet + 1))
            if [ "$quiet" -ge "$tick" ]; then
                printf '... %s: still running, %ds\n' "$name" $((SECONDS - t0))
                quiet=0
            fi
        else # end of output
            [ -n "$line" ] && printf '%s\n' "$line"
            break
        fi
    done
}
exit "${PIPESTATUS[0]}"
