#!/bin/sh
# ctest abi.exports: the dynamic symbols libasync.so defines are exactly the
# functions include/async.h and the classic include/async/async_classic.h
# declare (cabi/exports.map hides the rest: the
# la_* functions of cabi's subsystems, the Go exports, cgo's runtime glue),
# and the library's SONAME is libasync.so.<major>.
#   check_exports.sh <cc> <nm> <readelf> <include dir> <libasync.so> <soname>
set -eu
cc=$1 nm=$2 readelf=$3 inc=$4 so=$5 soname=$6
tmp=${TMPDIR:-/tmp}/abi_exports.$$
trap 'rm -f "$tmp".*' EXIT
# (the two headers refuse to share a translation unit: one each)
for h in "$inc/async.h" "$inc/async/async_classic.h"; do
    [ -f "$h" ] && "$cc" -E -P -x c -I"$inc" "$h"
done | grep -oE '\basync_[a-z0-9_]+ *\(' | tr -d ' (' | sort -u >"$tmp.api"
# Defined dynamic symbols, without the version node (LIBASYNC_0).
"$nm" -D --defined-only "$so" | awk '$2 != "A" { sub(/@.*/, "", $3); print $3 }' | sort -u >"$tmp.so"
status=0
missing=$(comm -23 "$tmp.api" "$tmp.so")
extra=$(comm -13 "$tmp.api" "$tmp.so")
[ -z "$missing" ] || { echo "declared in the headers but not exported: $missing"; status=1; }
[ -z "$extra" ] || { echo "exported but declared in no header: $extra"; status=1; }
got=$("$readelf" -d "$so" | sed -n 's/.*(SONAME).*\[\(.*\)\].*/\1/p')
[ "$got" = "$soname" ] || { echo "SONAME is '$got', want '$soname'"; status=1; }
echo "$(wc -l <"$tmp.api") functions in the headers, $(wc -l <"$tmp.so") exported, SONAME $got"
exit $status
