#!/usr/bin/env bash
# gradsync-sim against real runs, in one go on this machine: runs the calibration spec
# (experiments/specs/sim_calibration.textproto: bsp, ssp s=3 with a straggler, asp and ring
# all-reduce, dense and top-k 1% + error feedback, 2 / 4 / 8 workers, every process in its own
# network namespace behind tc tbf at 100 Mbit/s and 1 Gbit/s, and unshaped veth links; some 10
# minutes, needs root and iproute2), then simulates the same spec and prints the comparison:
# per run the measured and predicted step time (the median over the workers of their wall time
# per step, from the row at 10% of the steps) and bytes per worker and step, and the errors.
# Exit status 1 when a run is outside 15% (step time) or 1% (bytes).
# --repeat=N measures the spec N times (OUT_DIR, then OUT_DIR-repeat2 ... -repeatN, one after the
# other, N times as long) and compares each run against the median of its N measurements, with
# their range: one measurement of a run on this 2-core machine moves by up to a third.
# --spec=SPEC: another spec of the same kind (experiments/specs/sim_rounds.textproto: local SGD and
# DiLoCo, PowerSGD and DC-ASGD; experiments/specs/sim_holdout.textproto: other shapes), which the
# calibration was not fitted on; with --only its runs `compute`, `compute-*`, `codec` and
# `ar-codec` (those it has) are always run.
# Usage: bench/sim_calibration.sh [OUT_DIR] [--only=RUNS] [--repeat=N] [--spec=SPEC]    (default OUT_DIR: results)
# The simulation reads OUT_DIR/sim_calibration/compute/metrics.csv and codec/trace.json (the first
# measurement's), as the spec says, so OUT_DIR other than results needs the spec's compute_from
# changed too.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/machine.sh
bin=${BUILD_DIR:-build}/bin
out=results
only=()
repeat=1
spec=experiments/specs/sim_calibration.textproto
for a in "$@"; do
  case "$a" in
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --spec=*) spec=${a#--spec=} ;;
    --only=*) only=("$a") ;;
    --repeat=*) repeat=${a#--repeat=}
      [[ $repeat =~ ^[1-9][0-9]?$ ]] || { echo "sim_calibration.sh: --repeat=$repeat is not a count from 1 to 99" >&2; exit 2; } ;;
    *) out=$a ;;
  esac
done
[ -f "$spec" ] || { echo "sim_calibration.sh: no spec $spec" >&2; exit 2; }
name=$(basename "$spec" .textproto)
mkdir -p "$out"
echo "# gradsync-sim against real runs ($name): $(machine)"
run_only=()
if [ ${#only[@]} -gt 0 ]; then
  # The inputs the simulation reads: the lone workers' compute (compute, compute-bN) and the codec traces.
  inputs=$(grep -o 'name: "\(compute[^"]*\|codec\|ar-codec\)"' "$spec" | sed 's/^name: "//; s/"$//' | paste -sd, -)
  run_only=("${only[0]},$inputs")
fi
compare=""
for k in $(seq 1 "$repeat"); do
  dir=$out
  [ "$k" -gt 1 ] && dir=$out-repeat$k
  mkdir -p "$dir"
  [ "$repeat" -gt 1 ] && echo "measurement $k of $repeat: $dir ($(date -u +%T))"
  "$bin"/gradsync-run "$spec" --out="$dir" "${run_only[@]}" > "$dir/$name.log" 2>&1 || { tail -20 "$dir/$name.log"; exit 1; }
  compare+="${compare:+,}$dir/$name"
done
"$bin"/gradsync-sim "$spec" --out="$out-sim" --compare="$compare" "${only[@]}" | sed -n '/^| run | mode | link/,$p'
