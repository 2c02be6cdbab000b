#!/usr/bin/env bash
# Builds the unit tests with AddressSanitizer + UndefinedBehaviorSanitizer into build-asan/ and
# runs them (ctest -L unit). Any sanitizer report fails the run: UB is not recoverable
# (-fno-sanitize-recover=undefined) and ASan / LSan stop at the first error.
# Environment: CC / CXX (the system's cc / c++), JOBS (all cores). Extra arguments go to ctest
# (e.g. -R Codec).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
build_dir=build-asan
# -O1 -g1: stack traces with lines at a reasonable speed; no -DNDEBUG, so assert() stays on.
cmake -S . -B "$build_dir" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1" \
  "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1" \
  -DCMAKE_CXX_FLAGS=-fno-sanitize-recover=undefined \
  -DGRADSYNC_SANITIZE=address,undefined \
  -DGRADSYNC_CUDA=OFF \
  -DGRADSYNC_PYTHON=OFF \
  -DGRADSYNC_BUILD_TESTS=ON \
  -DGRADSYNC_BUILD_BENCH=OFF > "$build_dir.configure.log" 2>&1 ||
  { cat "$build_dir.configure.log"; exit 1; }
cmake --build "$build_dir" -j "${JOBS:-$(nproc)}" --target gradsync_unit_tests

export ASAN_OPTIONS="halt_on_error=1:abort_on_error=1:detect_leaks=1:check_initialization_order=1:strict_init_order=1:detect_stack_use_after_return=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="halt_on_error=1:abort_on_error=1:print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
cd "$build_dir"
ctest --output-on-failure -j "$(nproc)" --timeout 600 -L unit "$@"
