#!/usr/bin/env bash
# Configures and builds gradsync into build/ (binaries in build/bin/).
# Environment: BUILD_DIR (build), BUILD_TYPE (Release), GRADSYNC_CUDA (AUTO|ON|OFF),
# GRADSYNC_WERROR (ON in CI and the test script), JOBS (all cores).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
cmake -S . -B "$build_dir" \
  -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-Release}" \
  -DGRADSYNC_CUDA="${GRADSYNC_CUDA:-AUTO}" \
  -DGRADSYNC_WERROR="${GRADSYNC_WERROR:-OFF}" > "$build_dir.configure.log" 2>&1 ||
  { cat "$build_dir.configure.log"; exit 1; }
grep -E '^-- gradsync' "$build_dir.configure.log" || true
cmake --build "$build_dir" -j "${JOBS:-$(nproc)}"
