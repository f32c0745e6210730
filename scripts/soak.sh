#!/usr/bin/env bash
# Soak: runs the stress cases (ctests/queue/mpmc_stress.c,
# ctests/runtime/loop_stress.c, ctests/fiber_sched/stress_park.c) for minutes
# each, and the fiber echo of ctests/fiber_io/stress_echo.c with 10000
# connections, sampling every second the process's
# resident memory (VmRSS in /proc/<pid>/status) and open descriptors
# (/proc/<pid>/fd). A case fails if it fails on its own (every case checks
# nothing was lost, duplicated or reordered), or if after its warm-up (the
# first quarter of the run) RSS rises above the warm-up peak by more than
# SOAK_RSS_PCT percent plus SOAK_RSS_SLACK_KB, or the fd count above the
# warm-up peak plus SOAK_FD_SLACK.
#
# Not part of `make test` (it takes long); a short smoke run:
#   SOAK_SECONDS=10 scripts/soak.sh
# The full run (about 40 minutes with the defaults):
#   scripts/soak.sh
#
# Environment:
#   BUILD              build directory holding the stress binaries (default: build;
#                      built with `make build` first)
#   SOAK_SECONDS       seconds per case (default 180)
#   SOAK_CASES         cases to run (default: every stress case)
#   SOAK_BACKENDS      backends for the runtime cases (default: "epoll poll")
#   SOAK_CONNS         connections of the echo soak (default 10000)
#   SOAK_RSS_PCT       allowed RSS growth after warm-up, percent (default 25)
#   SOAK_RSS_SLACK_KB  plus this much (default 16384)
#   SOAK_FD_SLACK      allowed fd growth after warm-up (default 8)
#   SOAK_OUT           where the samples go, one CSV per run (default: $BUILD/soak)
set -uo pipefail
cd "$(dirname "$0")/.."

BUILD=${BUILD:-build}
SOAK_SECONDS=${SOAK_SECONDS:-180}
SOAK_CASES=${SOAK_CASES:-"stress_no_policy stress_drop_oldest stress_block_writer completions_from_threads timers_from_threads stress_attach fds_from_threads fibers_park echo_soak"}
SOAK_BACKENDS=${SOAK_BACKENDS:-"epoll poll"}
SOAK_CONNS=${SOAK_CONNS:-10000}
SOAK_RSS_PCT=${SOAK_RSS_PCT:-25}
SOAK_RSS_SLACK_KB=${SOAK_RSS_SLACK_KB:-16384}
SOAK_FD_SLACK=${SOAK_FD_SLACK:-8}
SOAK_OUT=${SOAK_OUT:-$BUILD/soak}
# case_bin CASE: the test binary that holds the stress case.
case_bin() {
  case "$1" in
    stress_*) echo "$BUILD/ctests/queue/mpmc_stress" ;;
    completions_from_threads | timers_from_threads | fds_from_threads) echo "$BUILD/ctests/runtime/loop_stress" ;;
    fibers_park) echo "$BUILD/ctests/fiber_sched/stress_park" ;;
    echo_soak) echo "$BUILD/ctests/fiber_io/stress_echo" ;;
    *) echo "soak: unknown case $1" >&2; return 1 ;;
  esac
}

for c in $SOAK_CASES; do
  bin=$(case_bin "$c") || exit 1
  if [ ! -x "$bin" ]; then
    echo "soak: $bin not found; build first (make build, or BUILD=<dir>)" >&2
    exit 1
  fi
done
mkdir -p "$SOAK_OUT"

# runtime cases run on every backend; the others once
runtime_case() {
  case "$1" in completions_from_threads | timers_from_threads | stress_attach | fds_from_threads) return 0 ;; esac
  return 1
}

# The fds case itself opens and closes up to 4 threads x 16 slots x 2 fds at
# any moment: its samples move within that band.
fd_slack() { case "$1" in fds_from_threads) echo $((SOAK_FD_SLACK + 128)) ;; *) echo "$SOAK_FD_SLACK" ;; esac; }

failures=0
summary=()

# run_one CASE BACKEND: runs, samples, judges; appends a summary line.
run_one() {
  local c=$1 b=$2 bin csv log pid start now t rss fds rc
  bin=$(case_bin "$c")
  csv=$SOAK_OUT/soak-$c-$b.csv
  log=$SOAK_OUT/soak-$c-$b.log
  echo "soak: $c ($b) for ${SOAK_SECONDS}s"
  if [ "$b" = default ]; then
    env -u ASYNC_BACKEND ASYNC_STRESS_SECONDS="$SOAK_SECONDS" ASYNC_SOAK_CONNS="$SOAK_CONNS" "$bin" "$c" >"$log" 2>&1 &
  else
    ASYNC_BACKEND=$b ASYNC_STRESS_SECONDS=$SOAK_SECONDS ASYNC_SOAK_CONNS=$SOAK_CONNS "$bin" "$c" >"$log" 2>&1 &
  fi
  pid=$!
  start=$(date +%s.%N)
  echo "seconds,rss_kb,fds" >"$csv"
  while kill -0 "$pid" 2>/dev/null; do
    rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status" 2>/dev/null)
    fds=$(ls "/proc/$pid/fd" 2>/dev/null | wc -l)
    now=$(date +%s.%N)
    t=$(awk -v a="$start" -v b="$now" 'BEGIN {printf "%.1f", b - a}')
    [ -n "$rss" ] && [ "$fds" -gt 0 ] && echo "$t,$rss,$fds" >>"$csv"
    sleep 1
  done
  wait "$pid"
  rc=$?
  # warm-up: the first quarter; judge everything sampled after it (while the case ran)
  local verdict
  verdict=$(awk -F, -v total="$SOAK_SECONDS" -v pct="$SOAK_RSS_PCT" -v slack="$SOAK_RSS_SLACK_KB" \
    -v fslack="$(fd_slack "$c")" '
    NR == 1 { next }
    $1 <= total / 4 { if ($2 > r0) r0 = $2; if ($3 > f0) f0 = $3; next }
    $1 <= total { if ($2 > r1) r1 = $2; if ($3 > f1) f1 = $3; n++ }
    END {
      if (n == 0 || r0 == 0) { printf "NOSAMPLES warm-up rss %d fds %d", r0, f0; exit }
      bad = (r1 > r0 * (1 + pct / 100) + slack) || (f1 > f0 + fslack)
      printf "%s rss %d -> %d KiB, fds %d -> %d (%d samples after warm-up)", bad ? "GREW" : "flat", r0, r1, f0, f1, n
    }' "$csv")
  local line="$c ($b): exit $rc; $verdict"
  if [ "$rc" != 0 ] || [[ "$verdict" != flat* ]]; then
    failures=$((failures + 1))
    line="FAIL $line (log: $log)"
    tail -5 "$log" | sed 's/^/    /'
  else
    line="ok   $line"
  fi
  echo "soak: $line"
  summary+=("$line")
}

for c in $SOAK_CASES; do
  if runtime_case "$c"; then
    for b in $SOAK_BACKENDS; do run_one "$c" "$b"; done
  else
    run_one "$c" default
  fi
done

echo
echo "soak summary (${SOAK_SECONDS}s per case; samples in $SOAK_OUT):"
printf '  %s\n' "${summary[@]}"
if [ "$failures" -gt 0 ]; then
  echo "soak: $failures run(s) failed" >&2
  exit 1
fi
echo "soak: all runs passed"
