#!/usr/bin/env bash
# A/B of DC-ASGD's correction on a shard (DelayCompensation::Correct) against an earlier commit:
# REV's server/shard/delay_compensation.{h,cc}, renamed into namespace gradsync_old, compiled
# beside this checkout's into one program (bench/dc/dc_ab.cc) with the build's flags (-O3,
# -fopenmp-simd), run on N floats (default 227,461: the CNN's larger shard) for ROUNDS rounds.
#   bench/delay_compensation_ab.sh REV [N] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/machine.sh
rev=${1:?usage: bench/delay_compensation_ab.sh REV [N] [ROUNDS]}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
rename='s/namespace gradsync {/namespace gradsync_old {\nusing gradsync::Segment;/'
at=server/shard/transform/delay_compensation  # server/shard/delay_compensation before the transform room
git cat-file -e "$rev:$at.h" 2>/dev/null || at=server/shard/delay_compensation
moved='s|"server/shard/gradient_transform.h"|"server/shard/transform/gradient_transform.h"|'
git show "$rev:$at.h" | sed "$rename; s/#pragma once//; $moved" > "$dir/old.h"
git show "$rev:$at.cc" | sed "$rename; $moved" |
  sed "s|#include \"$at.h\"|#include \"old.h\"|" > "$dir/old.cc"
g++ -std=c++20 -O3 -DNDEBUG -fopenmp-simd -I. -I"$dir" bench/dc/dc_ab.cc "$dir/old.cc" \
  server/shard/transform/delay_compensation.cc -o "$dir/dc_ab"
echo "# delay compensation A/B, $rev against $(git rev-parse --short HEAD)$(git diff --quiet || echo +changes): $(machine)"
"$dir/dc_ab" "${2:-227461}" "${3:-5}"
