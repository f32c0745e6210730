#!/usr/bin/env bash
# make bench: builds libasync and every benchmark (ours and the peers'), runs
# them interleaved (ours, peer, ours, peer ... for ROUNDS rounds), prints the
# table of medians and ratios and writes it into docs/PERFORMANCE.md.
#
# Environment: ROUNDS (default 5), BENCH_DOC (default docs/PERFORMANCE.md;
# empty = do not write it), BENCH_QUICK=1 (small op counts, 2 rounds, for
# trying the harness; its results are not written to the doc), BENCH_ROWS=regex
# (only the rows whose name matches, e.g. 'queue|timers'; the doc is not written
# and the strace and 1M-fiber passes are skipped).
# Exit status: 0, or 1 if a benchmark failed a correctness check or libasync
# did not build. Missed performance targets do not fail the run.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
B=$ROOT/bench
OUT=${BENCH_OUT:-$B/out}
ROUNDS=${ROUNDS:-5}
DOC=${BENCH_DOC-$ROOT/docs/PERFORMANCE.md}
COMMAND="make bench"
SCALE=1
if [[ ${BENCH_QUICK:-0} == 1 ]]; then
  ROUNDS=2 SCALE=10 DOC="" COMMAND="BENCH_QUICK=1 make bench"
fi
ONLY=${BENCH_ROWS:-}
[[ -n $ONLY ]] && DOC=""
mkdir -p "$OUT"
log() { printf '== %s\n' "$*" >&2; }

# ---------------------------------------------------------------- packages
PKGS=(libuv1-dev libboost-context-dev libboost-fiber-dev liburing-dev cmake build-essential pkg-config strace
  nginx wrk curl iproute2)
missing=()
for p in "${PKGS[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  log "installing ${missing[*]}"
  SUDO=""
  [[ $(id -u) == 0 ]] || SUDO=sudo
  $SUDO apt-get update -q >"$OUT/apt.log" 2>&1
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${missing[@]}" >>"$OUT/apt.log" 2>&1 ||
    { cat "$OUT/apt.log" >&2; exit 1; }
fi
command -v go >/dev/null || PATH=$PATH:/usr/local/go/bin
command -v go >/dev/null || { echo "bench: the Go toolchain (go) is needed to build libasync" >&2; exit 1; }

# ---------------------------------------------------------------- build
# The http rows: the load driver and nginx's configuration next to the
# programs, the raw epoll peer, and examples/http_server built against the
# library (a server that does not build is left out: its runs report ok=0).
build_http() {
  cp "$B/http_load.sh" "$B/http_nginx.conf" "$OUT/"
  gcc "${CFLAGS[@]}" -I"$ROOT/examples/http_server" -o "$OUT/http_epoll" "$B/http_epoll.c" \
    "$ROOT/examples/http_server/http_parse.c"
  rm -f "$OUT/http_server"
  [[ $ours_ok == 1 && -d $ROOT/examples/http_server ]] || return 0
  gcc "${CFLAGS[@]}" -I"$ROOT/include" -o "$OUT/http_server" $(ls "$ROOT"/examples/http_server/*.c | grep -v /test_) \
    -L"$OUT" -lasync -Wl,-rpath,"$OUT" -lpthread >"$OUT/http_server_build.log" 2>&1 ||
    log "examples/http_server did not build (see $OUT/http_server_build.log): its http runs report ok=0"
}
CFLAGS=(-O2 -Wall -Wextra -I"$B")
ours_ok=1
log "building libasync (go build -buildmode=c-shared ./cabi)"
if ! (cd "$ROOT" && CGO_ENABLED=1 go build -buildmode=c-shared \
      -ldflags=-extldflags=-Wl,-soname,libasync.so,--version-script,"$ROOT"/cabi/exports.map -o "$OUT/libasync.so" ./cabi) >"$OUT/build.log" 2>&1; then
  cat "$OUT/build.log" >&2
  log "libasync did not build: running the peers only, docs/PERFORMANCE.md is left as it is"
  ours_ok=0 DOC=""
fi
log "building the benchmarks"
for src in "$B"/*_async.c; do
  [[ $ours_ok == 1 ]] || break
  gcc "${CFLAGS[@]}" -I"$ROOT/include" -o "$OUT/$(basename "$src" .c)" "$src" \
    -L"$OUT" -lasync -Wl,-rpath,"$OUT" -lpthread
done
UV=$(pkg-config --cflags --libs libuv)
for p in completions_uv latency_uv timers_uv echo_uv offload_uv; do
  # shellcheck disable=SC2086
  gcc "${CFLAGS[@]}" -o "$OUT/$p" "$B/$p.c" $UV -lpthread
done
for p in latency_efd fdlatency_epoll queue_ring echo_epoll tcp_client; do
  gcc "${CFLAGS[@]}" -o "$OUT/$p" "$B/$p.c" -lpthread
done
gcc "${CFLAGS[@]}" -o "$OUT/echo_uring" "$B/echo_uring.c" -luring
build_http
g++ -O2 -Wall -Wextra -o "$OUT/fibers_boost" "$B/fibers_boost.cpp" -lboost_fiber -lboost_context -lpthread
(cd "$B/go" && go build -o "$OUT/go_timers" ./timers && go build -o "$OUT/go_chanqueue" ./chanqueue &&
  go build -o "$OUT/go_fibers" ./fibers && go build -o "$OUT/go_echo" ./echo && go build -o "$OUT/report" ./report)

# ---------------------------------------------------------------- machine
{
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) online CPUs"
  echo "kernel: $(uname -sr)"
  echo "os: $(. /etc/os-release && echo "$PRETTY_NAME")"
  echo "go: $(go version | cut -d' ' -f3-)"
  echo "gcc: $(gcc -dumpfullversion)"
  echo "libuv: $(pkg-config --modversion libuv)"
  echo "nginx: $(/usr/sbin/nginx -v 2>&1 | sed 's|.*/||')"
  echo "wrk: $(wrk -v 2>&1 | head -n1 | cut -d' ' -f2)"
  echo "libasync: $(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo unknown)$(cd "$ROOT" &&
    git status --porcelain -- libasync port cabi include 2>/dev/null | grep -q . && echo ' + uncommitted changes')"
  echo "load average before the run: $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$OUT/machine.txt"

# ---------------------------------------------------------------- run
# "row impl [NAME=value ...] program args" (the assignments go into the
# program's environment). The impls of one row run back to back, and their
# order alternates between rounds (A B, then B A) so neither side always goes
# first. Fiber rows: 1 libasync worker against Boost.Fiber's single thread and
# Go with GOMAXPROCS=1, then 2 workers against GOMAXPROCS=2 (targets too for
# spawn and ping-pong). Echo rows: bench/tcp_client starts the server named
# after its sizes (conns, round trips per connection, message bytes); the
# tcp_client process passes its environment on to the server. Per size:
# 1 worker on the default path against the 1-thread peers, 2 workers (against
# the 1-worker run in the report), and ASYNC_FIBER_IO=uring against the
# io_uring peer (tcp_client reports which path the server really used).
# HTTP rows: bench/http_load.sh starts the server (PORT in its arguments is
# the port it picks), loads it with wrk and measures HSECS seconds once every
# connection is up and answered (the server's CPU from /proc, its answers
# from the connections' tcp_info); the OS places wrk and the server
# (HTTP_PIN=W,S in the environment of make bench pins them).
n() { echo $(($1 / SCALE)); }
HSECS=$((SCALE == 1 ? 4 : 2))
BENCHES=(
  "completions libasync completions_async 4 $(n 1000000)"
  "completions libuv completions_uv 4 $(n 1000000)"
  "latency libasync latency_async $(n 5000)"
  "latency eventfd latency_efd $(n 5000)"
  "latency libuv latency_uv $(n 5000)"
  "fdlatency libasync fdlatency_async $(n 5000)"
  "fdlatency epoll fdlatency_epoll $(n 5000)"
  "queue_1p1c libasync queue_async 1 $(n 2000000)"
  "queue_1p1c ring queue_ring 1 $(n 2000000)"
  "queue_1p1c gochan go_chanqueue 1 $(n 2000000)"
  "queue_4p1c libasync queue_async 4 $(n 500000)"
  "queue_4p1c ring queue_ring 4 $(n 500000)"
  "queue_4p1c gochan go_chanqueue 4 $(n 500000)"
  "offload libasync offload_async $(n 20000) $(n 500000)"
  "offload libuv offload_uv $(n 20000) $(n 500000)"
  "timers libasync timers_async $(n 1000000)"
  "timers libuv timers_uv $(n 1000000)"
  "timers gotimers go_timers $(n 1000000)"
  "cgo libasync cgo_async $(n 2000000)"
  "fiber_yield libasync fibers_async yield 1 2 $(n 1000000)"
  "fiber_yield boostfiber fibers_boost yield 2 $(n 1000000)"
  "fiber_yield go1 go_fibers yield 1 2 $(n 1000000)"
  "fiber_yield_2w libasync fibers_async yield 2 4 $(n 500000)"
  "fiber_yield_2w go2 go_fibers yield 2 4 $(n 500000)"
  "fiber_spawn libasync fibers_async spawn 1 $(n 200000) 100"
  "fiber_spawn boostfiber fibers_boost spawn $(n 200000) 100"
  "fiber_spawn go1 go_fibers spawn 1 $(n 200000) 100"
  "fiber_spawn_2w libasync fibers_async spawn 2 $(n 200000) 100"
  "fiber_spawn_2w go2 go_fibers spawn 2 $(n 200000) 100"
  "fiber_pingpong libasync fibers_async pingpong 1 $(n 1000000)"
  "fiber_pingpong boostfiber fibers_boost pingpong $(n 1000000)"
  "fiber_pingpong go1 go_fibers pingpong 1 $(n 1000000)"
  "fiber_pingpong_timed libasync fibers_async pingpong 1 $(n 200000) 10000"
  "fiber_pingpong_2w libasync fibers_async pingpong 2 $(n 200000)"
  "fiber_pingpong_2w go2 go_fibers pingpong 2 $(n 200000)"
  "fiber_parked libasync fibers_async parked 1 $(n 100000) 16"
  "fiber_parked go1 go_fibers parked 1 $(n 100000)"
  "fiber_cancel_scope libasync fibers_async cancel 1 $(n 10000) 10"
  "fiber_cancel_scope_2w libasync fibers_async cancel 2 $(n 10000) 10"
  "echo_1k libasync tcp_client $(n 1000) 30 64 echo_async 1"
  "echo_1k epoll tcp_client $(n 1000) 30 64 echo_epoll"
  "echo_1k libuv tcp_client $(n 1000) 30 64 echo_uv"
  "echo_1k go1 tcp_client $(n 1000) 30 64 go_echo 1"
  "echo_1k_2w libasync tcp_client $(n 1000) 30 64 echo_async 2"
  "echo_1k_2w go2 tcp_client $(n 1000) 30 64 go_echo 2"
  "echo_1k_uring libasync ASYNC_FIBER_IO=uring tcp_client $(n 1000) 30 64 echo_async 1"
  "echo_1k_uring uring tcp_client $(n 1000) 30 64 echo_uring"
  "echo_10k libasync tcp_client $(n 10000) 5 64 echo_async 1"
  "echo_10k epoll tcp_client $(n 10000) 5 64 echo_epoll"
  "echo_10k libuv tcp_client $(n 10000) 5 64 echo_uv"
  "echo_10k go1 tcp_client $(n 10000) 5 64 go_echo 1"
  "echo_10k_2w libasync tcp_client $(n 10000) 5 64 echo_async 2"
  "echo_10k_2w go2 tcp_client $(n 10000) 5 64 go_echo 2"
  "echo_10k_uring libasync ASYNC_FIBER_IO=uring tcp_client $(n 10000) 5 64 echo_async 1"
  "echo_10k_uring uring tcp_client $(n 10000) 5 64 echo_uring"
  "http_100 libasync http_load.sh 100 $HSECS http_server --host 127.0.0.1 --port PORT --workers 1"
  "http_100 nginx http_load.sh 100 $HSECS nginx"
  "http_100 epoll http_load.sh 100 $HSECS http_epoll PORT"
  "http_10k libasync http_load.sh $(n 10000) $HSECS http_server --host 127.0.0.1 --port PORT --workers 1"
  "http_10k nginx http_load.sh $(n 10000) $HSECS nginx"
  "http_10k epoll http_load.sh $(n 10000) $HSECS http_epoll PORT"
  "http_100_2w libasync http_load.sh 100 $HSECS http_server --host 127.0.0.1 --port PORT --workers 2"
  "fib_100k_2w libasync fibers_async fib 2 $(n 100000) 20 10"
)
# Run once, after the rounds (too slow to repeat: most of the time goes to
# first-touch page faults): the full-size parked-fibers row.
ONCE=(
  "fiber_parked_1m libasync fibers_async parked 1 $(n 1000000) 16"
  "fiber_parked_1m go1 go_fibers parked 1 $(n 1000000)"
)
RESULTS=$OUT/results.txt
: >"$RESULTS"

run_one() { # round row impl [NAME=value ...] prog args...
  local round=$1 row=$2 impl=$3
  shift 3
  local vars=() prog line rc=0
  while [[ $1 =~ ^[A-Za-z_][A-Za-z0-9_]*= ]]; do
    vars+=("$1")
    shift
  done
  prog=$1
  shift
  line=$(env ${vars[@]+"${vars[@]}"} timeout 120 "$OUT/$prog" "$@" 2>>"$OUT/stderr.txt" | tail -n1) || rc=$?
  if [[ $rc != 0 && $line != ok=0* ]]; then
    line="ok=0 error=\"$prog exited with status $rc\""
  fi
  echo "row=$row impl=$impl round=$round $line" | tee -a "$RESULTS" >&2
}

: >"$OUT/stderr.txt"
for ((round = 1; round <= ROUNDS; round++)); do
  log "round $round of $ROUNDS"
  row_lines=()
  flush_row() {
    local k
    if ((round % 2 == 0)); then
      for ((k = ${#row_lines[@]} - 1; k >= 0; k--)); do run_one "$round" ${row_lines[k]}; done
    else
      for ((k = 0; k < ${#row_lines[@]}; k++)); do run_one "$round" ${row_lines[k]}; done
    fi
    row_lines=()
  }
  prev=""
  for spec in "${BENCHES[@]}"; do
    read -r row impl _ <<<"$spec"
    [[ $impl == libasync && $ours_ok == 0 ]] && continue
    [[ -n $ONLY && ! $row =~ ^($ONLY) ]] && continue
    [[ -n $prev && $row != "$prev" ]] && flush_row
    row_lines+=("$spec")
    prev=$row
  done
  flush_row
done

[[ -n $ONLY ]] && ONCE=()
log "single pass: 1M parked fibers"
for spec in "${ONCE[@]}"; do
  read -r _ impl _ <<<"$spec"
  [[ $impl == libasync && $ours_ok == 0 ]] && continue
  # shellcheck disable=SC2086
  run_one 1 $spec
done

# Wake syscalls seen from outside: one shorter pass of the completions bench
# per side under strace (ptrace slows the syscalls it stops at, so these runs
# are not timed; the in-process counts above come from the timed runs).
strace_pass() { # impl prog
  local impl=$1 prog=$2 msgs=$((4 * $(n 100000))) f="$OUT/strace_$1.txt" opt=()
  strace --seccomp-bpf -V >/dev/null 2>&1 && opt=(--seccomp-bpf)
  if ! timeout 120 strace "${opt[@]}" -f -qq -c -e trace=write,futex -o "$f" \
       "$OUT/$prog" 4 "$(n 100000)" >"$OUT/strace_$1.out" 2>&1; then
    echo "row=completions_strace impl=$impl round=1 ok=0 error=\"$prog under strace failed\"" | tee -a "$RESULTS" >&2
    return
  fi
  awk -v impl="$impl" -v msgs="$msgs" '
    $NF == "write" { w = $4 } $NF == "futex" { f = $4 }
    END { printf "row=completions_strace impl=%s round=1 ok=1 writes_per_msg=%.6f futex_per_msg=%.6f\n",
                 impl, w / msgs, f / msgs }' "$f" | tee -a "$RESULTS" >&2
}
if [[ -z $ONLY ]] && command -v strace >/dev/null; then
  log "strace pass (wake syscalls)"
  [[ $ours_ok == 1 ]] && strace_pass libasync completions_async
  strace_pass libuv completions_uv
fi

# ---------------------------------------------------------------- report
rc=0
"$OUT/report" -results "$RESULTS" -machine "$OUT/machine.txt" -command "$COMMAND" \
  ${DOC:+-doc "$DOC"} || rc=$?
[[ -n $DOC ]] && log "wrote $DOC"
log "done in ${SECONDS}s"
[[ $ours_ok == 1 ]] || rc=1
exit "$rc"
