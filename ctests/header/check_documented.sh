#!/bin/sh
# ctest header.documented: every function declared in include/async.h and
# include/async/async_classic.h has a documentation comment.
#
# The rule (what the headers keep):
#   A function declaration is documented when the line right above it (no
#   blank line between) ends a comment that is not a section banner (a
#   banner is a comment line that starts with "/* ---"), or ends another
#   documented declaration: declarations written one after the other with
#   no blank line between them form a group, and the comment above the
#   first one documents them all.
#   A declaration is a line at column 0 that is not a preprocessor line, a
#   typedef or inside a comment, and names async_<name>( ; it ends at its
#   ';' (it may span lines).
# With a C compiler as second argument, the names the preprocessed headers
# declare must also be the names this scan found, so that a declaration
# the scan cannot read fails the test instead of going unchecked.
#   check_documented.sh <include dir> [cc]
set -eu
inc=$1
cc=${2:-}
tmp=${TMPDIR:-/tmp}/header_documented.$$
trap 'rm -f "$tmp".*' EXIT
status=0
: >"$tmp.seen"
for h in "$inc/async.h" "$inc/async/async_classic.h"; do
    awk -v file="$h" -v seen="$tmp.seen" '
    function banner(l) { return l ~ /^[ \t]*\/\*[ \t]*---/ }
    {
        line = $0
        if (incomment) {
            if (index(line, "*/")) {
                incomment = 0
                prev = banner(line) ? "other" : "comment"
            }
            next
        }
        if (indecl) { # a declaration that spans lines: its group goes on
            if (line ~ /;[ \t]*(\/\*.*\*\/)?[ \t]*$/) indecl = 0
            prev = "decl"
            next
        }
        if (line ~ /^[A-Za-z_][A-Za-z0-9_ \t*]*[ \t*]async_[a-z0-9_]+[ \t]*\(/ && line !~ /^typedef[ \t]/) {
            name = line
            sub(/[ \t]*\(.*/, "", name)
            sub(/.*[ \t*]/, "", name)
            print name >> seen
            ok = (prev == "comment" || (prev == "decl" && prevok))
            if (!ok) {
                printf "%s:%d: %s has no documentation comment\n", file, NR, name
                bad = 1
            }
            prevok = ok
            if (line !~ /;[ \t]*(\/\*.*\*\/)?[ \t]*$/) indecl = 1
            prev = "decl"
            next
        }
        s = index(line, "/*")
        if (s) {
            rest = substr(line, s + 2)
            if (!index(rest, "*/")) {
                incomment = 1
                next
            }
            # a comment that ends on this line: a doc comment only when the
            # line ends with it and starts with it (not code with a comment)
            if (line ~ /\*\/[ \t]*$/ && line ~ /^[ \t]*\/\*/ && !banner(line)) prev = "comment"
            else prev = "other"
            next
        }
        if (line ~ /\*\/[ \t]*$/) { prev = banner(line) ? "other" : "comment"; next }
        prev = "other"
    }
    END { exit bad }' "$h" || status=1
done
n=$(sort -u "$tmp.seen" | wc -l)
if [ -n "$cc" ]; then
    # (the two headers refuse to share a translation unit: one each)
    for h in "$inc/async.h" "$inc/async/async_classic.h"; do
        "$cc" -E -P -x c -I"$inc" "$h"
    done | grep -oE '\basync_[a-z0-9_]+ *\(' | tr -d ' (' | sort -u >"$tmp.api"
    sort -u "$tmp.seen" >"$tmp.scan"
    unseen=$(comm -23 "$tmp.api" "$tmp.scan")
    if [ -n "$unseen" ]; then
        echo "declared, but not found by this scan (write the declaration on a line of its own):" $unseen
        status=1
    fi
fi
[ "$status" = 0 ] && echo "$n functions declared, each documented"
exit $status
