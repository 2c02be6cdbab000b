#!/usr/bin/env bash
# What processes sharing this machine cost each other's compute: K local training processes
# (gradsync-worker --mode=local, the Fashion-MNIST MLP, batch 32) at once, for K in the list, and
# per process the CPU time (user + system) and the wall time per step. The steps are counted as
# the difference between a long and a short run of each K (1,800 and 300 steps, both within the
# first epoch), so start-up, data loading and the final evaluation cancel out. CPU per step
# above K=1's is what the processes cost each other (caches, memory bandwidth, switches); wall per
# step over CPU per step is how many processes share a core. gradsync-sim's compute_from takes
# the lone worker's time (K=1).
# Usage: bench/compute_interference.sh [K ...]    (default: 1 2 4 8; BUILD_DIR=build)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/machine.sh
case "${1:-}" in -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
worker=${BUILD_DIR:-build}/bin/gradsync-worker
[ -x "$worker" ] || { echo "compute_interference.sh: $worker is not built (scripts/build.sh)" >&2; exit 2; }
ks=("$@")
[ ${#ks[@]} -gt 0 ] || ks=(1 2 4 8)
for k in "${ks[@]}"; do
  [[ $k =~ ^[1-9][0-9]?$ ]] || { echo "compute_interference.sh: $k is not a process count from 1 to 99" >&2; exit 2; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
short=300
long=1800
# Mean CPU seconds and wall seconds of K processes of STEPS steps each, run at once.
run() {
  local k=$1 steps=$2 pids=()
  for i in $(seq 1 "$k"); do
    /usr/bin/time -f "%U %S %e" -o "$tmp/$i.time" "$worker" --mode=local --batch=32 --epochs=1 --max-steps="$steps" \
      > "$tmp/$i.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || { echo "compute_interference.sh: a worker failed:" >&2; tail -3 "$tmp"/*.log >&2; exit 1; }; done
  awk '{cpu += $1 + $2; wall += $3; n++} END {printf "%.4f %.4f", cpu / n, wall / n}' "$tmp"/*.time
}
echo "# compute interference: $(machine)"
echo "| processes | CPU ms/step | vs alone | wall ms/step |"
echo "|---|---|---|---|"
alone=""
for k in "${ks[@]}"; do
  # (run's exit inside $(...) ends only the subshell: checked here.)
  short_t=$(run "$k" "$short") || exit 1
  long_t=$(run "$k" "$long") || exit 1
  read -r cpu_s wall_s <<< "$short_t"
  read -r cpu_l wall_l <<< "$long_t"
  cpu=$(awk -v a="$cpu_s" -v b="$cpu_l" -v n=$((long - short)) 'BEGIN {printf "%.3f", (b - a) / n * 1e3}')
  wall=$(awk -v a="$wall_s" -v b="$wall_l" -v n=$((long - short)) 'BEGIN {printf "%.3f", (b - a) / n * 1e3}')
  [ -n "$alone" ] || alone=$cpu
  echo "| $k | $cpu | $(awk -v c="$cpu" -v a="$alone" 'BEGIN {printf "%+.0f%%", (c / a - 1) * 100}') | $wall |"
done
