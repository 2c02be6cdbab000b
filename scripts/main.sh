#!/usr/bin/env bash
# The main job: set up, build, and run the default experiment (experiments/specs/quick.textproto):
# bsp, ssp (s=3), asp and all-reduce, dense and with top-k 1% + error feedback, 4 workers with
# one straggler, on Fashion-MNIST; about 70 s on 2 cores once built (the build of a fresh clone takes about 7 min more; scripts/measure-readme.sh measures both). Writes results/quick/:
# summary.md, summary.json, accuracy / staleness plots, and per run metrics.csv and commands.txt.
# Extra arguments go to gradsync-run (e.g. --only=bsp,ssp3, or another spec's path first).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
BUILD_LOG=build.log scripts/build.sh
spec=experiments/specs/quick.textproto
if [[ $# -gt 0 && "$1" != -* ]]; then
  spec=$1
  shift
fi
exec build/bin/gradsync-run "$spec" --out=results "$@"
