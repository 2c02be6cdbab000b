#!/usr/bin/env bash
# Runs the whole test suite (ctest -j2, as scripts/test.sh does on this machine) ROUNDS times
# (default 3) in a fresh clone of HEAD while a second fresh clone runs the same suite over and
# over, so that every test meets the load, the ports and the temporary files of another run.
# Prints one line per round with the failures named; exits non-zero if any round of either
# clone failed. Environment: STRESS_DIR (default: a new directory under /tmp; both clones,
# their builds and every round's log stay there).
set -euo pipefail
rounds=${1:-3}
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "stress-tests: ROUNDS must be a positive count, got '$rounds'" >&2; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
work=${STRESS_DIR:-$(mktemp -d /tmp/gradsync-stress.XXXXXX)}
mkdir -p "$work"
echo "stress-tests: clones of $(git -C "$root" rev-parse --short HEAD) in $work (a: $rounds rounds, b: a loop)"

for c in a b; do
  rm -rf "${work:?}/$c"
  git clone -q "$root" "$work/$c"
done
start=$SECONDS
(cd "$work/a" && BUILD_LOG=build.log scripts/build.sh > "$work/a-build.out" 2>&1) & pa=$!
(cd "$work/b" && BUILD_LOG=build.log scripts/build.sh > "$work/b-build.out" 2>&1) & pb=$!
wait "$pa" || { echo "stress-tests: clone a does not build ($work/a/build.log)" >&2; exit 1; }
wait "$pb" || { echo "stress-tests: clone b does not build ($work/b/build.log)" >&2; exit 1; }
echo "stress-tests: both clones built in $((SECONDS - start)) s"

# One ctest round; prints "N tests, M failed: names" and returns ctest's status.
round() {  # dir log
  local rc=0
  (cd "$1/build" && ctest -j 2 --timeout 300 --output-on-failure > "$2" 2>&1) || rc=$?
  local summary failed
  summary=$(grep -E 'tests passed, [0-9]+ tests failed out of' "$2" || echo "ctest stopped early (status $rc)")
  failed=$(sed -n '/^The following tests FAILED:/,$p' "$2" | grep -E '^\s+[0-9]+ - ' |
           sed -E 's/^\s+[0-9]+ - //' | paste -sd ';' - || true)
  echo "$summary${failed:+: $failed}"
  return "$rc"
}

rm -f "$work/stop"
(
  i=0
  while [[ ! -e "$work/stop" ]]; do
    i=$((i + 1))
    t=$SECONDS
    if line=$(round "$work/b" "$work/b-round-$i.log"); then s=ok; else s=FAILED; fi
    [[ -e "$work/stop" && "$line" == "ctest stopped early"* ]] && break
    echo "stress-tests: b round $i ($((SECONDS - t)) s) $s: $line"
    [[ "$s" == ok ]] || touch "$work/b-failed"
  done
) & loop=$!

failed=0
for ((i = 1; i <= rounds; i++)); do
  t=$SECONDS
  if line=$(round "$work/a" "$work/a-round-$i.log"); then s=ok; else s=FAILED; failed=1; fi
  echo "stress-tests: a round $i ($((SECONDS - t)) s) $s: $line"
done

# Stop the other clone's loop: its ctest and every test process it started.
touch "$work/stop"
for p in $(pgrep -f "ctest -j 2 --timeout 300" || true); do
  [[ "$(readlink "/proc/$p/cwd" 2>/dev/null)" == "$work/b/build" ]] && kill -INT "$p" 2>/dev/null
done
wait "$loop" 2>/dev/null || true
pkill -f "$work/b/build/" 2>/dev/null || true
[[ -e "$work/b-failed" ]] && failed=1
echo "stress-tests: $([[ $failed == 0 ]] && echo "no failure" || echo "FAILURES above; logs in $work")"
exit "$failed"
