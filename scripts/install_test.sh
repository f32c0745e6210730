#!/usr/bin/env bash
# Tests the installed package as a user sees it (make test-install; part of
# make test). Installs the build to a temporary prefix, MOVES the tree (the
# pkg-config files and the CMake package must be relocatable), then builds
# and runs one small C program six ways against it:
#   1. pkg-config libasync                (shared; run with LD_LIBRARY_PATH,
#      and with -Wl,-rpath,$(pkg-config --variable=libdir libasync))
#   2. pkg-config libasync-static         (static: no libasync.so needed)
#   3. CMake find_package, libasync::async        (shared; CMake's build rpath)
#   4. CMake find_package, libasync::async_static (static)
#   5. by hand: -I -L -lasync -Wl,-rpath  (shared)
#   6. by hand: libasync.a -lpthread -ldl (static)
# and checks that each links the library it should (shared or not) and that
# the library it runs reports the installed package's version. README.md's
# example ("A main loop in 20 lines") is built with README's pkg-config line
# and run: it must print got 0, got 1, got 2. A driver laid out like Neolith
# is built with the installed lib/async/CMakeLists.txt and run
# (ctests/install/classic_driver.sh). Then installs
# again and checks that scripts/uninstall.sh (make uninstall) removes every
# file. build/install_manifest.txt (what make uninstall reads) is restored.
#   scripts/install_test.sh [BUILD_DIR]      (default: build, already built)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
B=$(cd "${1:-build}" && pwd)
CC=${CC:-cc}
T=$(mktemp -d "${TMPDIR:-/tmp}/libasync-install.XXXXXX")
manifest=$B/install_manifest.txt
had_manifest=0
if [ -f "$manifest" ]; then
    cp -p "$manifest" "$T/manifest.saved"
    had_manifest=1
fi
cleanup() {
    if [ $had_manifest = 1 ]; then cp -p "$T/manifest.saved" "$manifest"; else rm -f "$manifest"; fi
    rm -rf "$T"
}
trap cleanup EXIT
fail() {
    echo "install-test: FAIL: $*" >&2
    exit 1
}
ok() { echo "install-test: ok   $*"; }

[ -f "$B/libasync.so" ] && [ -f "$B/libasync.a" ] || fail "$B is not built (make build)"
command -v pkg-config >/dev/null || fail "pkg-config is not installed"

cmake --install "$B" --prefix "$T/stage" >"$T/install.log" || {
    cat "$T/install.log"
    fail "cmake --install"
}
mv "$T/stage" "$T/moved" # relocated: nothing may still point at stage
P=$T/moved
pcdir=$(dirname "$(find "$P" -name libasync.pc -path '*/pkgconfig/*' | head -n 1)")
[ -d "$pcdir" ] || fail "no libasync.pc installed"
[ -f "$pcdir/libasync-static.pc" ] || fail "no libasync-static.pc installed"
LIBDIR=$(dirname "$pcdir")
VERSION=$(sed -n 's/^project(libasync VERSION \([0-9.]*\).*/\1/p' "$ROOT/CMakeLists.txt")
export PKG_CONFIG_PATH=$pcdir
[ "$(pkg-config --modversion libasync)" = "$VERSION" ] || fail "pkg-config --modversion libasync"
if grep -rq "$T/stage" "$P"; then
    grep -rl "$T/stage" "$P" >&2
    fail "the installed files above name the install prefix (not relocatable)"
fi

cat >"$T/app.c" <<'C'
#include <async.h>
#include <stdio.h>
#include <string.h>
/* argv[1]: the version the package claims. The library must report it, and
 * be the one the header describes; then one completion round trip. */
int main(int argc, char **argv) {
    io_event_t ev;
    async_runtime_t *rt;
    if (argc != 2 || strcmp(async_version_string(), argv[1]) != 0 || async_version() != ASYNC_VERSION_NUMBER) {
        fprintf(stderr, "app: library %s (%d), header %d, package %s\n", async_version_string(), async_version(),
                ASYNC_VERSION_NUMBER, argc > 1 ? argv[1] : "?");
        return 1;
    }
    rt = async_runtime_init();
    if (!rt || async_runtime_post_completion(rt, 7, 42) != 0 || async_runtime_wait(rt, &ev, 1, 5000) != 1 ||
        ev.completion_key != 7 || ev.data != 42) {
        fprintf(stderr, "app: runtime round trip failed: %s\n", async_strerror(async_last_error()));
        return 1;
    }
    async_runtime_deinit(rt);
    printf("libasync %s\n", async_version_string());
    return 0;
}
C

# check <name> <exe> shared|static [env...]: links libasync.so or not; runs.
check() {
    local name=$1 exe=$2 kind=$3
    shift 3
    local needed
    needed=$(readelf -d "$exe" | grep NEEDED | grep -c 'libasync\.so' || true)
    if [ "$kind" = shared ] && [ "$needed" = 0 ]; then fail "$name: $exe does not link libasync.so"; fi
    if [ "$kind" = static ] && [ "$needed" != 0 ]; then fail "$name: $exe links libasync.so, not libasync.a"; fi
    env "$@" "$exe" "$VERSION" >"$T/$name.out" 2>&1 || {
        cat "$T/$name.out" >&2
        fail "$name: $exe did not run"
    }
    ok "$name ($kind, $(stat -c %s "$exe") bytes)"
}

# shellcheck disable=SC2046 # word splitting of pkg-config's output is wanted
$CC -o "$T/app_pc" "$T/app.c" $(pkg-config --cflags --libs libasync) || fail "pkg-config libasync: build"
check pkg-config "$T/app_pc" shared LD_LIBRARY_PATH="$LIBDIR"
# shellcheck disable=SC2046
$CC -o "$T/app_pc_rpath" "$T/app.c" $(pkg-config --cflags --libs libasync) \
    -Wl,-rpath,"$(pkg-config --variable=libdir libasync)" || fail "pkg-config libasync with rpath: build"
check pkg-config-rpath "$T/app_pc_rpath" shared

# README.md's example, built as README says.
awk '/^## A main loop in 20 lines/ { sec = 1; next }
     sec && /^```c/ { on = 1; next }
     on && /^```/ { exit }
     on { print }' "$ROOT/README.md" >"$T/readme.c"
[ -s "$T/readme.c" ] || fail "README.md: no C example under \"A main loop in 20 lines\""
# shellcheck disable=SC2046
$CC -o "$T/readme" "$T/readme.c" $(pkg-config --cflags --libs libasync) \
    -Wl,-rpath,"$(pkg-config --variable=libdir libasync)" || fail "README example: build"
"$T/readme" >"$T/readme.out" 2>&1 || { cat "$T/readme.out" >&2; fail "README example did not run"; }
# got 0..2 in order; a worker that did not get to run within the example's
# 500 ms (a loaded machine) may leave the tail out, but nothing else.
case "$(printf 'got 0\ngot 1\ngot 2')" in
"$(cat "$T/readme.out")"*) ;;
*) cat "$T/readme.out" >&2; fail "README example: wrong output" ;;
esac
ok "README example (pkg-config with rpath): $(grep -c got "$T/readme.out") of 3 lines"
# shellcheck disable=SC2046
$CC -o "$T/app_pc_static" "$T/app.c" $(pkg-config --cflags --libs libasync-static) ||
    fail "pkg-config libasync-static: build"
check pkg-config-static "$T/app_pc_static" static

mkdir -p "$T/cm"
cp "$T/app.c" "$T/cm/app.c"
cat >"$T/cm/CMakeLists.txt" <<CM
cmake_minimum_required(VERSION 3.16)
project(app LANGUAGES C)
find_package(libasync $VERSION REQUIRED)
add_executable(app_shared app.c)
target_link_libraries(app_shared PRIVATE libasync::async)
add_executable(app_static app.c)
target_link_libraries(app_static PRIVATE libasync::async_static)
CM
cmake -S "$T/cm" -B "$T/cm/build" -DCMAKE_PREFIX_PATH="$P" -DCMAKE_BUILD_TYPE=Release >"$T/cm.log" 2>&1 &&
    cmake --build "$T/cm/build" >>"$T/cm.log" 2>&1 || {
    cat "$T/cm.log" >&2
    fail "CMake find_package(libasync): configure or build"
}
check cmake-shared "$T/cm/build/app_shared" shared
check cmake-static "$T/cm/build/app_static" static

# A classic driver laid out like Neolith, with only its lib/async/CMakeLists.txt
# replaced by the installed one (docs/CLASSIC_API.md).
bash "$ROOT/ctests/install/classic_driver.sh" "$P" >"$T/driver.log" 2>&1 || {
    cat "$T/driver.log" >&2
    fail "classic driver (ctests/install/classic_driver.sh)"
}
ok "classic driver: $(tail -n 1 "$T/driver.log")"

$CC -o "$T/app_hand" "$T/app.c" -I"$P/include" -L"$LIBDIR" -lasync -Wl,-rpath,"$LIBDIR" || fail "by hand: build"
check by-hand-shared "$T/app_hand" shared
$CC -o "$T/app_hand_static" "$T/app.c" -I"$P/include" "$LIBDIR/libasync.a" -lpthread -ldl ||
    fail "by hand, static: build"
check by-hand-static "$T/app_hand_static" static

# make uninstall: every installed file goes.
cmake --install "$B" --prefix "$T/again" >"$T/install.log"
bash "$ROOT/scripts/uninstall.sh" "$manifest" >"$T/uninstall.log" || {
    cat "$T/uninstall.log" >&2
    fail "uninstall"
}
left=$(find "$T/again" ! -type d)
[ -z "$left" ] || fail "uninstall left: $left"
[ ! -d "$(dirname "$pcdir" | sed "s|^$P|$T/again|")/cmake/libasync" ] || fail "uninstall left the cmake/libasync directory"
ok "uninstall ($(grep -c . "$manifest") files)"
echo "install-test: all passed"
