#!/usr/bin/env bash
# Configures and builds gradsync into build/ (binaries in build/bin/).
# Environment: BUILD_DIR (build), BUILD_TYPE (Release), GRADSYNC_CUDA (AUTO|ON|OFF),
# GRADSYNC_WERROR (ON in CI and the test script), JOBS (all cores).
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
  -DGRADSYNC_WERROR="${GRADSYNC_WERROR:-OFF}" > "$build_dir.configure.log" 2>&1 ||
  { cat "$build_dir.configure.log"; exit 1; }
grep -E '^-- gradsync' "$build_dir.configure.log" || true
cmake --build "$build_dir" -j "${JOBS:-$(nproc)}"
