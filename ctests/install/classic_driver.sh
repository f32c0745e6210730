#!/usr/bin/env bash
# ctest install.classic_driver (and make test-install): a driver laid out like
# Neolith (ctests/install/classic_driver/: lib/port, lib/logger, lib/async
# holding a console worker that uses port/sync.h's platform_mutex_t through
# the classic headers, lib/socket reaching async/async_runtime.h through
# lib/ and linking only port, src/comm.c calling async_runtime_post_read)
# builds against the INSTALLED libasync with one change inside lib/async:
# its CMakeLists.txt is the one libasync installs
# (share/libasync/classic/lib/async/CMakeLists.txt). Then it runs: two
# console lines and their end through the worker, a socket read on its
# readiness, a notification posted from lib/socket.
#   classic_driver.sh --install BUILD_DIR   (installs BUILD_DIR to a temporary prefix)
#   classic_driver.sh PREFIX                (an installed libasync)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
T=$(mktemp -d "${TMPDIR:-/tmp}/libasync-driver.XXXXXX")
trap 'rm -rf "$T"' EXIT
fail() {
    echo "classic-driver: FAIL: $*" >&2
    exit 1
}
if [ "${1:-}" = --install ]; then
    B=$(cd "$2" && pwd)
    P=$T/prefix
    # a copy of the manifest: this install must not change what make uninstall removes
    [ -f "$B/install_manifest.txt" ] && cp -p "$B/install_manifest.txt" "$T/manifest.saved"
    cmake --install "$B" --prefix "$P" >"$T/install.log" 2>&1 || { cat "$T/install.log" >&2; fail "cmake --install"; }
    if [ -f "$T/manifest.saved" ]; then cp -p "$T/manifest.saved" "$B/install_manifest.txt"; else rm -f "$B/install_manifest.txt"; fi
else
    P=$(cd "${1:?usage: classic_driver.sh PREFIX | --install BUILD_DIR}" && pwd)
fi
shipped=$(find "$P" -path '*/share/libasync/classic/lib/async/CMakeLists.txt' | head -n 1)
[ -n "$shipped" ] || fail "no share/libasync/classic/lib/async/CMakeLists.txt under $P"

D=$T/driver
cp -R "$HERE/classic_driver" "$D"
cp "$shipped" "$D/lib/async/CMakeLists.txt" # the one change
# nothing but lib/async/CMakeLists.txt differs from the driver as it is kept
diff -r -x CMakeLists.txt "$HERE/classic_driver/lib/async" "$D/lib/async" >/dev/null || fail "lib/async differs"
diff -r -x async "$HERE/classic_driver" "$D" >/dev/null || fail "a file outside lib/async differs"

cmake -S "$D" -B "$D/build" -DCMAKE_PREFIX_PATH="$P" -DCMAKE_BUILD_TYPE=Release >"$T/cmake.log" 2>&1 &&
    cmake --build "$D/build" >>"$T/cmake.log" 2>&1 || {
    cat "$T/cmake.log" >&2
    fail "configure or build"
}
readelf -d "$D/build/src/minidriver" | grep -q 'NEEDED.*libasync\.so' || fail "minidriver does not link libasync.so"
printf 'hello\nworld\n' | "$D/build/src/minidriver" >"$T/run.out" 2>&1 || {
    cat "$T/run.out" >&2
    fail "minidriver did not run"
}
grep -qx 'minidriver: ok' "$T/run.out" || { cat "$T/run.out" >&2; fail "minidriver: no ok"; }
grep -qx 'console: hello' "$T/run.out" && grep -qx 'console: world' "$T/run.out" || {
    cat "$T/run.out" >&2
    fail "minidriver: console lines"
}
echo "classic-driver: ok (built against $P with only lib/async/CMakeLists.txt replaced)"
