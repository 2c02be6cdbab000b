#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/) with clang into build-fuzz/ and runs each for SECONDS
# (default 30) on a copy of its seed corpus (fuzz/corpus/<target>/). Prints one line per target:
# its name, the executions run, and 0 or the path of the input that crashed it; exits non-zero
# if any target crashed (a crash, a sanitizer report, a timeout of 10 s, or more than 2 GB).
#   scripts/fuzz.sh [SECONDS]
# Environment: JOBS (all cores), FUZZ_TARGETS (default: fuzz_message fuzz_spec fuzz_codecs and the
# three planes' fuzz_ps_plane fuzz_control_plane fuzz_replica_plane).
# A crashing input is reproduced with: build-fuzz/bin/<target> PATH (FUZZ_VERBOSE=1 says more).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-30}
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || [[ "$seconds" -lt 1 ]]; then
  echo "usage: scripts/fuzz.sh [SECONDS]" >&2
  exit 2
fi
scripts/setup.sh
build_dir=build-fuzz
read -ra targets <<< "${FUZZ_TARGETS:-fuzz_message fuzz_spec fuzz_codecs fuzz_ps_plane fuzz_control_plane fuzz_replica_plane}"
# -O1 -gline-tables-only: the usual fuzzing build; no -DNDEBUG, so assert() stays on.
CC=clang CXX=clang++ cmake -S . -B "$build_dir" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only" \
  "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only" \
  -DGRADSYNC_FUZZ=ON \
  -DGRADSYNC_CUDA=OFF \
  -DGRADSYNC_PYTHON=OFF \
  -DGRADSYNC_BUILD_TESTS=OFF \
  -DGRADSYNC_BUILD_BENCH=OFF > "$build_dir.configure.log" 2>&1 ||
  { cat "$build_dir.configure.log"; exit 1; }
cmake --build "$build_dir" -j "${JOBS:-$(nproc)}" --target "${targets[@]}"

work="$build_dir/run"
rm -rf "$work"
mkdir -p "$work"
failed=0
for t in "${targets[@]}"; do
  corpus="$work/corpus-$t"
  mkdir -p "$corpus" "$work/artifacts"
  cp -r "fuzz/corpus/$t/." "$corpus/"
  log="$work/$t.log"
  rc=0
  "$build_dir/bin/$t" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 \
    -artifact_prefix="$work/artifacts/$t-" -print_final_stats=1 "$corpus" > "$log" 2>&1 || rc=$?
  # libFuzzer's last line is "Done N runs in S second(s)"; a crash ends it early, and then its
  # final statistics say how many inputs ran.
  runs=$(sed -n 's/^Done \([0-9]*\) runs.*/\1/p' "$log" | tail -n 1)
  if [[ -z "$runs" ]]; then
    runs=$(sed -n 's/^stat::number_of_executed_units: *\([0-9]*\).*/\1/p' "$log" | tail -n 1)
  fi
  artifact=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -n 1)
  if [[ $rc -ne 0 || -n "$artifact" ]]; then
    failed=1
    printf '%-14s %10s runs  crashes: %s\n' "$t" "${runs:-?}" "${artifact:-exit status $rc, see $log}"
    grep -E 'ERROR|runtime error|fuzz_[a-z]+: ' "$log" | head -n 5 | sed 's/^/    /' >&2 || true
  else
    printf '%-14s %10s runs  crashes: 0\n' "$t" "${runs:-?}"
  fi
done
exit $failed
