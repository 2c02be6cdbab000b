#!/usr/bin/env bash
# Measures the README's two commands on a fresh clone of HEAD, as a new user runs them: the
# build that scripts/main.sh does first, then the main job itself, then scripts/test.sh (which
# reuses the build). Prints the machine, the three times, the test count and the main job's
# table (results/quick/summary.md), ready to paste into README.md. Environment: MEASURE_DIR
# (default: a new directory under /tmp; the clone and every log stay there). Run it on a
# machine doing nothing else: the times are the machine's, not the code's alone.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=${MEASURE_DIR:-$(mktemp -d /tmp/gradsync-measure.XXXXXX)}
rev=$(git -C "$root" rev-parse --short HEAD)
rm -rf "${work:?}/clone"
git clone -q "$root" "$work/clone"
cd "$work/clone"
echo "measure-readme: fresh clone of $rev in $work/clone (logs: $work/*.out)"

load=$(cut -d' ' -f1-3 /proc/loadavg)
t0=$SECONDS
scripts/setup.sh > "$work/setup.out" 2>&1
BUILD_LOG=build.log scripts/build.sh > "$work/build.out" 2>&1 ||
  { tail -20 "$work/build.out"; echo "measure-readme: the build failed" >&2; exit 1; }
build_s=$((SECONDS - t0))
steps=$(grep -c -E '^\[ *[0-9]+%\] (Building|Linking)' build.log || true)

t0=$SECONDS
scripts/main.sh > "$work/main.out" 2>&1 || { tail -20 "$work/main.out"; echo "measure-readme: scripts/main.sh failed" >&2; exit 1; }
main_s=$((SECONDS - t0))

t0=$SECONDS
test_rc=0
scripts/test.sh > "$work/test.out" 2>&1 || test_rc=$?
test_s=$((SECONDS - t0))
tests=$(grep -oE '[0-9]+ tests failed out of [0-9]+' "$work/test.out" | grep -oE '[0-9]+$' || echo "?")
failed=$(grep -oE '[0-9]+ tests failed out of' "$work/test.out" | grep -oE '^[0-9]+' || echo "?")

cpu=$(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //')
mem=$(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo)
min() { awk -v s="$1" 'BEGIN { printf "%.1f min", s / 60 }'; }
echo
echo "Measured on $(date +%Y-%m-%d) at $rev, on $(nproc) cores ($cpu), $mem, Debian $(cat /etc/debian_version), load average $load at the start:"
echo "- fresh clone: setup and build $(min "$build_s") ($build_s s, $steps compile and link steps)"
echo "- scripts/main.sh, once built: $main_s s"
echo "- scripts/test.sh, once built: $(min "$test_s") ($tests tests, $failed failed)"
echo
echo "The main job's table (results/quick/summary.md):"
echo
sed -n '/^| run /,/^$/p' results/quick/summary.md
if [[ $test_rc -ne 0 ]]; then
  echo "measure-readme: scripts/test.sh failed (status $test_rc): $work/test.out" >&2
  exit 1
fi
