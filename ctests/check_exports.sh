#!/bin/sh
# ctest abi.exports: the dynamic symbols libasync.so defines are exactly the
# functions include/async.h declares (cabi/exports.map hides the rest: the
# la_* functions of cabi's subsystems, the Go exports, cgo's runtime glue),
# and the library's SONAME is libasync.so.<major>.
#   check_exports.sh <cc> <nm> <readelf> <async.h> <libasync.so> <soname>
set -eu
cc=$1 nm=$2 readelf=$3 header=$4 so=$5 soname=$6
tmp=${TMPDIR:-/tmp}/abi_exports.$$
trap 'rm -f "$tmp".*' EXIT
"$cc" -E -P -x c "$header" | grep -oE '\basync_[a-z0-9_]+ *\(' | tr -d ' (' | sort -u >"$tmp.api"
# Defined dynamic symbols, without the version node (LIBASYNC_0).
"$nm" -D --defined-only "$so" | awk '$2 != "A" { sub(/@.*/, "", $3); print $3 }' | sort -u >"$tmp.so"
status=0
missing=$(comm -23 "$tmp.api" "$tmp.so")
extra=$(comm -13 "$tmp.api" "$tmp.so")
[ -z "$missing" ] || { echo "declared in async.h but not exported: $missing"; status=1; }
[ -z "$extra" ] || { echo "exported but not in async.h: $extra"; status=1; }
got=$("$readelf" -d "$so" | sed -n 's/.*(SONAME).*\[\(.*\)\].*/\1/p')
[ "$got" = "$soname" ] || { echo "SONAME is '$got', want '$soname'"; status=1; }
echo "$(wc -l <"$tmp.api") functions in async.h, $(wc -l <"$tmp.so") exported, SONAME $got"
exit $status
