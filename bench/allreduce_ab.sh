#!/usr/bin/env bash
# A/B of the CPU all-reduce between two builds, on one machine, rounds alternated: the rows
# bench/allreduce_compare.sh measures for gradsync (gradsync-bench-allreduce --processes, every
# algorithm and size), from OLD_BIN and NEW_BIN in turn (odd rounds new first), then one row per
# (ranks, size, algorithm): the median over rounds of each side's p50 and new/old busbw
# (>= 0.95: within 5%).
#   bench/allreduce_ab.sh OLD_BIN_DIR NEW_BIN_DIR [ROUNDS]     (default 3 rounds)
#   environment: SIZES (4096,65536,1048576,4194304,16777216,67108864), RANKS (2 4),
#                ALGOS (auto,ring,rhd,rd,tree), ITERS (200; fewer for big sizes, iters * size <= 2 GiB)
set -euo pipefail
cd "$(dirname "$0")/.."
old=${1:?usage: bench/allreduce_ab.sh OLD_BIN_DIR NEW_BIN_DIR [ROUNDS]}
new=${2:?usage: bench/allreduce_ab.sh OLD_BIN_DIR NEW_BIN_DIR [ROUNDS]}
rounds=${3:-3}
sizes=${SIZES:-4096,65536,1048576,4194304,16777216,67108864}
ranks=${RANKS:-2 4}
algos=${ALGOS:-auto,ring,rhd,rd,tree}
iters=${ITERS:-200}
for b in "$old" "$new"; do
  [[ -x $b/gradsync-bench-allreduce ]] || { echo "allreduce_ab.sh: no $b/gradsync-bench-allreduce" >&2; exit 2; }
done
. bench/machine.sh
echo "# all-reduce A/B: $(machine); $rounds rounds, sizes $sizes, ranks $ranks, algorithms $algos"
out=$(mktemp -d)
run() {  # SIDE BIN ROUND
  local n
  for n in $ranks; do
    "$2/gradsync-bench-allreduce" --processes --ranks "$n" --iters "$iters" --algos "$algos" --sizes "$sizes" \
      --json "$out/$1-$3-$n.json" >/dev/null
  done
}
for r in $(seq 1 "$rounds"); do
  if (( r % 2 )); then run old "$old" "$r"; run new "$new" "$r"; else run new "$new" "$r"; run old "$old" "$r"; fi
  echo "# round $r of $rounds done ($(date -u +%T))" >&2
done
python3 - "$out" <<'PY'
import glob, json, statistics, sys
rows = {}
for path in glob.glob(sys.argv[1] + "/*.json"):
    side = path.rsplit("/", 1)[1].split("-")[0]
    for r in json.load(open(path)):
        rows.setdefault((r["ranks"], r["bytes"], r["algo"]), {}).setdefault(side, []).append(r)
print("| ranks | bytes | algo | old p50 us | new p50 us | old busbw GB/s | new busbw GB/s | new/old busbw |")
print("|---|---|---|---|---|---|---|---|")
worst = None
for key in sorted(rows):
    o, n = rows[key].get("old", []), rows[key].get("new", [])
    if not o or not n:
        continue
    med = lambda xs, f: statistics.median(x[f] for x in xs)
    ratio = med(n, "busbw") / med(o, "busbw") if med(o, "busbw") > 0 else float("nan")
    worst = ratio if worst is None or ratio < worst else worst
    print(f"| {key[0]} | {key[1]} | {key[2]} | {med(o, 'p50_us'):.1f} | {med(n, 'p50_us'):.1f} | {med(o, 'busbw'):.3f} | {med(n, 'busbw'):.3f} | {ratio:.3f} |")
print(f"# worst new/old busbw: {worst:.3f}")
PY
rm -rf "$out"
