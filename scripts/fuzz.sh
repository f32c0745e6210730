#!/usr/bin/env bash
# Runs every Go fuzz target of the fuzzed packages for FUZZTIME each, then
# copies the corpus entries the fuzzer found (Go keeps them in its cache)
# into <package>/testdata/fuzz/<target>/, where plain `go test <package>`
# replays them and git can keep them. The packages:
#   ./libasync             FuzzQueueModel, FuzzWheel, FuzzCompletions: the Go
#                          models against themselves
#   ./cabi/internal/queue  FuzzQueueDiff: the C queue (queue.c) against
#                          libasync.Queue
#   ./cabi/internal/rt     FuzzCompletionsDiff: the C completion path
#                          (completions.c) against a FIFO model
# and any target added to them later.
#
#   scripts/fuzz.sh                     # 10 s per target (the CI run)
#   FUZZTIME=10m scripts/fuzz.sh        # a long run
#   FUZZ_TARGETS=FuzzWheel scripts/fuzz.sh
#
# Environment:
#   FUZZTIME       per target, as for go test -fuzztime (default 10s)
#   FUZZ_TARGETS   space-separated target names (default: all)
#   FUZZ_KEEP      1 (default): copy new corpus entries into testdata; 0: don't
#   FUZZ_KEEP_MAX  at most this many entries per target in testdata (default 100)
#   FUZZ_PARALLEL  fuzzing workers (default 2)
#
# A failing input is written by go test itself to
# <package>/testdata/fuzz/<target>/<hash>; the script then exits 1. Replay it
# with: go test -run '<target>/<hash>' <package>
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"

FUZZTIME=${FUZZTIME:-10s}
FUZZ_KEEP=${FUZZ_KEEP:-1}
FUZZ_KEEP_MAX=${FUZZ_KEEP_MAX:-100}
FUZZ_PARALLEL=${FUZZ_PARALLEL:-2}
pkgs="./libasync ./cabi/internal/queue ./cabi/internal/rt"
want=" ${FUZZ_TARGETS:-} "

failed=()
ran=0
for pkg in $pkgs; do
  cache="$(go env GOCACHE)/fuzz/$(go list "$pkg")"
  for t in $(go test -list '^Fuzz' "$pkg" | grep '^Fuzz' || true); do
    [ -z "${FUZZ_TARGETS:-}" ] || [[ "$want" == *" $t "* ]] || continue
    ran=$((ran + 1))
    echo "fuzz: $pkg $t for $FUZZTIME"
    # Go's fuzzing engine sometimes ends a run with "context deadline
    # exceeded" and no failing input when a worker is slow to stop on a
    # loaded machine; that is retried once. A real failure writes its input
    # into testdata/fuzz/<target>/ and is never retried.
    before=$(find "${pkg#./}/testdata/fuzz/$t" -type f 2>/dev/null | wc -l)
    out=$(mktemp)
    if ! { go test -run '^$' -fuzz "^${t}\$" -fuzztime "$FUZZTIME" -parallel "$FUZZ_PARALLEL" "$pkg" 2>&1 | tee "$out" ||
      { grep -q 'context deadline exceeded' "$out" &&
        [ "$(find "${pkg#./}/testdata/fuzz/$t" -type f 2>/dev/null | wc -l)" = "$before" ] &&
        echo "fuzz: $t: the fuzzing engine timed out stopping, with no failing input; once more" >&2 &&
        go test -run '^$' -fuzz "^${t}\$" -fuzztime "$FUZZTIME" -parallel "$FUZZ_PARALLEL" "$pkg"; }; }; then
      echo "fuzz: $t FAILED; the input is in ${pkg#./}/testdata/fuzz/$t/ (keep it with the fix)" >&2
      failed+=("$t")
      rm -f "$out"
      continue
    fi
    rm -f "$out"
    if [ "$FUZZ_KEEP" = 1 ] && [ -d "$cache/$t" ]; then
      dst=${pkg#./}/testdata/fuzz/$t
      mkdir -p "$dst"
      have=$(find "$dst" -type f | wc -l)
      kept=0
      # oldest first: entries found early cover the basics
      while IFS= read -r f; do
        [ "$have" -lt "$FUZZ_KEEP_MAX" ] || break
        b=$(basename "$f")
        [ -e "$dst/$b" ] && continue
        cp "$f" "$dst/$b"
        have=$((have + 1))
        kept=$((kept + 1))
      done < <(ls -tr "$cache/$t" | sed "s|^|$cache/$t/|")
      echo "fuzz: $t: kept $kept new corpus entries ($have in $dst)"
    fi
  done
done
[ "$ran" -gt 0 ] || { echo "fuzz: no fuzz target matched" >&2; exit 1; }

# the kept corpus must replay cleanly
go test -run '^Fuzz' -count=1 $pkgs
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: failed: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz: all targets passed"
