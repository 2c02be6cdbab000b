#!/usr/bin/env bash
# Configures and builds gradsync into build/ (binaries in build/bin/).
# Environment: BUILD_DIR (build), BUILD_TYPE (Release), GRADSYNC_CUDA (AUTO|ON|OFF),
# GRADSYNC_WERROR (ON: the main job, the tests and CI build with the same flags, so the second
# README command does not rebuild what the first built), JOBS (all cores), BUILD_LOG (a file:
# the compiler's output goes there and the terminal shows progress every 10%).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
# The CUDA toolkit lives in /usr/local/cuda on these machines; a non-login shell may not have it
# on the PATH, and GRADSYNC_CUDA=AUTO should find it all the same.
if ! command -v nvcc >/dev/null 2>&1 && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
cmake -S . -B "$build_dir" \
  -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-Release}" \
  -DGRADSYNC_CUDA="${GRADSYNC_CUDA:-AUTO}" \
  -DGRADSYNC_WERROR="${GRADSYNC_WERROR:-ON}" > "$build_dir.configure.log" 2>&1 ||
  { cat "$build_dir.configure.log"; exit 1; }
grep -E '^-- gradsync' "$build_dir.configure.log" || true
if [[ -z "${BUILD_LOG:-}" ]]; then
  exec cmake --build "$build_dir" -j "${JOBS:-$(nproc)}"
fi
echo "build: compiling into $build_dir/ with ${JOBS:-$(nproc)} jobs (compiler output in $BUILD_LOG)"
start=$SECONDS
set +e
# Progress counts compiler and linker steps only, so an up-to-date build prints none.
cmake --build "$build_dir" -j "${JOBS:-$(nproc)}" 2>&1 | tee "$BUILD_LOG" |
  awk '/^\[ *[0-9]+%\] (Building|Linking)/ { p = substr($0, 2, index($0, "%") - 2) + 0
         if (p >= next_p) { printf "build: %3d%%\n", p; fflush(); next_p = p - p % 10 + 10 } }'
status=${PIPESTATUS[0]}
set -e
if [[ $status -ne 0 ]]; then
  echo "build: FAILED; the end of $BUILD_LOG:"
  tail -50 "$BUILD_LOG"
  exit "$status"
fi
steps=$(grep -c -E '^\[ *[0-9]+%\] (Building|Linking)' "$BUILD_LOG" || true)
if [[ $steps -eq 0 ]]; then
  echo "build: up to date ($((SECONDS - start)) s)"
else
  echo "build: done in $((SECONDS - start)) s ($steps compile and link steps)"
fi
