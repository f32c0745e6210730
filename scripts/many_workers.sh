#!/usr/bin/env bash
# The many-workers matrix: runs every fiber C case of a build directory (the
# ctest labels fiber_sched, fiber_io, fiber_sync, fiber_stack, with their
# poll. and uring. variants) once per worker count in MANY_WORKERS, with
# ASYNC_WORKERS set to it: the schedulers the cases make with workers 0 (the
# default) get that many workers, far more than the CPUs of a small machine.
# Cases that choose their own worker count run as usual. Exits non-zero if
# any case fails under any count; the failed cases are then run once more,
# one at a time, to say which also fail alone (the status stays non-zero).
#
#   scripts/many_workers.sh <build-dir> [extra ctest arguments]
#   make test-many-workers [BUILD=build-asan]
#
# Environment:
#   MANY_WORKERS   the worker counts (default "16 64")
#   MANY_LABELS    the ctest label regex (default ^fiber_)
#   JOBS           ctest -j (default 2)
set -uo pipefail

if [ $# -lt 1 ] || [ ! -f "$1/CTestTestfile.cmake" ]; then
  echo "usage: scripts/many_workers.sh <build-dir> [ctest args]  (a configured and built build directory)" >&2
  exit 2
fi
build=$1
shift
counts=${MANY_WORKERS:-"16 64"}
labels=${MANY_LABELS:-^fiber_}
jobs=${JOBS:-2}
failed_log="$build/Testing/Temporary/LastTestsFailed.log"
status=0
summary=""

for n in $counts; do
  echo "many_workers: ASYNC_WORKERS=$n ctest -L '$labels' in $build"
  t0=$SECONDS
  rm -f "$failed_log"
  ASYNC_WORKERS=$n ctest --test-dir "$build" -L "$labels" -j"$jobs" --output-on-failure "$@"
  rc=$?
  took=$((SECONDS - t0))
  if [ $rc -eq 0 ]; then
    summary+="ASYNC_WORKERS=$n: passed in ${took}s"$'\n'
    continue
  fi
  status=1
  summary+="ASYNC_WORKERS=$n: FAILED (ctest status $rc) in ${took}s"$'\n'
  [ -f "$failed_log" ] || continue
  # lines "<number>:<name>"
  names=$(cut -d: -f2- "$failed_log")
  for t in $names; do
    if ASYNC_WORKERS=$n ctest --test-dir "$build" -R "^${t//./\\.}\$" --output-on-failure "$@" >/dev/null 2>&1; then
      summary+="  $t: failed in the run, passed alone"$'\n'
    else
      summary+="  $t: failed in the run and alone"$'\n'
    fi
  done
done

printf '%s' "$summary"
if [ $status -ne 0 ]; then
  echo "many_workers: FAILED" >&2
else
  echo "many_workers: all passed"
fi
exit $status
