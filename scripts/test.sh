#!/usr/bin/env bash
# Sets up, builds (warnings as errors) and runs every test. Extra arguments go to ctest
# (e.g. -L unit, -R Sampler).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
BUILD_LOG=build.log scripts/build.sh
cd build
ctest --output-on-failure -j "$(nproc)" --timeout 300 "$@"
