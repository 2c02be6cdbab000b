#!/usr/bin/env bash
# The main job: set up, build, and train the MLP on Fashion-MNIST in one process, printing
# per-epoch loss, test accuracy and samples/s. Metrics go to results/local/worker-0.csv.
# Extra arguments are passed to gradsync-worker (e.g. --epochs=3 --model=softmax).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh > build.log 2>&1 || { tail -50 build.log; exit 1; }
exec build/bin/gradsync-worker --mode=local --model=mlp --epochs=10 --out=results/local "$@"
