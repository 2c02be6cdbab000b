#!/usr/bin/env bash
# Fashion-MNIST job throughput of several builds or settings, launched alternately on this
# machine: each arm is NAME=BIN_DIR or NAME=BIN_DIR:FLAGS (space-separated worker flags; a flag
# written +--flag is gradsync-launch's), and every round runs each arm once, the order rotated
# every round so that drift falls on all alike.
#   bench/fmnist_ab.sh [--runs=N] [--servers=S] [--workers=W] [--mode=M] [--staleness=S] [--epochs=E] ARM...
#   e.g. bench/fmnist_ab.sh --runs=7 before=/tmp/old/build/bin tcp=build/bin:--shm=false shm=build/bin
#        bench/fmnist_ab.sh --mode=ssp --staleness=3 plain=build/bin traced=build/bin:+--trace
# Job samples/s of a run = worker 0's steps x batch (64) x workers / its training wall time
# (worker-0.json); prints per arm the median over runs, min and max, and the ratio to the first arm.
set -euo pipefail
runs=7 servers=2 workers=4 mode=bsp epochs=2 staleness=
arms=()
for a in "$@"; do
  case $a in
    --runs=*) runs=${a#*=} ;;
    --servers=*) servers=${a#*=} ;;
    --workers=*) workers=${a#*=} ;;
    --mode=*) mode=${a#*=} ;;
    --staleness=*) staleness=${a#*=} ;;
    --epochs=*) epochs=${a#*=} ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "fmnist_ab.sh: unknown option $a" >&2; exit 2 ;;
    *=*) arms+=("$a") ;;
    *) echo "fmnist_ab.sh: an arm is NAME=BIN_DIR[:FLAGS], not '$a'" >&2; exit 2 ;;
  esac
done
((${#arms[@]} >= 1)) || { echo "fmnist_ab.sh: give at least one arm (NAME=BIN_DIR[:FLAGS])" >&2; exit 2; }
for a in "${arms[@]}"; do
  spec=${a#*=}; bin=${spec%%:*}
  [[ -x $bin/gradsync-launch && -x $bin/gradsync-worker ]] || { echo "fmnist_ab.sh: no gradsync-launch in $bin" >&2; exit 2; }
done
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
n=${#arms[@]}
for ((r = 0; r < runs; ++r)); do
  echo "# round $((r + 1))/$runs" >&2
  for ((k = 0; k < n; ++k)); do
    a=${arms[$(((k + r) % n))]}
    name=${a%%=*}; spec=${a#*=}; bin=${spec%%:*}; flags=""
    [[ $spec == *:* ]] && flags=${spec#*:}
    launch_flags=() worker_flags=()
    for f in $flags; do
      if [[ $f == +* ]]; then launch_flags+=("${f#+}"); else worker_flags+=("$f"); fi
    done
    [[ -n $staleness ]] && launch_flags+=("--staleness=$staleness")
    dir=$out/$name-$r
    timeout 900 "$bin/gradsync-launch" --mode="$mode" --servers="$servers" --workers="$workers" --out="$dir" \
      "${launch_flags[@]}" -- --epochs="$epochs" "${worker_flags[@]}" >"$dir.log" 2>&1 || { echo "fmnist_ab.sh: $name round $r failed:" >&2; tail -5 "$dir.log" >&2; exit 1; }
  done
done
echo "# Fashion-MNIST, $mode${staleness:+ s=$staleness}, $servers servers x $workers workers, $epochs epochs, $runs runs per arm alternated; $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg) at the end; $(date -u +%F)"
python3 - "$out" "$workers" "${arms[@]}" <<'PY'
import json, statistics, sys, glob
out, workers, arms = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
base = None
print("| arm | settings | job samples/s (median) | min | max | vs %s |" % arms[0].split("=")[0])
print("|---|---|---|---|---|---|")
for a in arms:
    name, spec = a.split("=", 1)
    rates = []
    for f in sorted(glob.glob(f"{out}/{name}-[0-9]*/worker-0.json")):
        j = json.load(open(f))
        rates.append(int(j["steps"]) * 64 * workers / j["wall_s"])
    med = statistics.median(rates)
    base = base or med
    print(f"| {name} | {spec} | {med:.0f} | {min(rates):.0f} | {max(rates):.0f} | {med / base:.2f} |")
PY
