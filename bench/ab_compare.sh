#!/usr/bin/env bash
# A/B of gradsync against an earlier commit, both built here and run alternately on one machine:
# gradsync-bench-ps (push+pull GB/s, 1M and 16M floats, 1x1 and 2x2), the same as real server and
# worker processes over every value channel (gradsync-bench-ps --processes: zmq, tcp, shm),
# gradsync-bench-allreduce (busbw, 4 MiB and 64 MiB, 2 and 4 ranks), gradsync-bench-train-step
# (samples/s, softmax and MLP at batch 64 and 256), the 2x4 Fashion-MNIST bsp job (job samples/s,
# as bench/fmnist_ab.sh) and bench/pytorch/compare.py (the frontend's allreduce and bsp, with the
# old build as its --baseline-bin-dir). A refactor must stay within 3% (ratio >= 0.97) in every row.
#   bench/ab_compare.sh REV [ROUNDS]      # default 5 rounds; REV built in .ab/REV (git worktree)
#   AB_PARTS=ps,processes,fmnist bench/ab_compare.sh REV   # only these parts (default: all of
#                                         # ps, processes, allreduce, trainstep, fmnist, pytorch)
# Each measurement (one configuration of one bench) runs for both sides back to back, old first
# on even rounds and new first on odd ones, so that the machine's drift falls on a pair alike.
# Prints one row per measurement: each side's median over rounds, new/old of those medians, and
# the median of the rounds' paired ratios (each round's new over the same round's old), which
# drift between the rounds cannot move; a row passes when the paired median is >= 0.97.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/machine.sh
rev=${1:?usage: bench/ab_compare.sh REV [ROUNDS]}
rounds=${2:-5}
parts=${AB_PARTS:-ps,processes,allreduce,trainstep,fmnist,pytorch}
has() { [[ ,$parts, == *,$1,* ]]; }
old_src=.ab/$(git rev-parse --short "$rev")
if [[ ! -d "$old_src" ]]; then
  mkdir -p .ab
  git worktree add --detach "$old_src" "$rev" >/dev/null
fi
targets=(gradsync-bench-ps gradsync-bench-allreduce gradsync-bench-train-step gradsync-server gradsync-worker
         gradsync-launch)
has pytorch && targets+=(gradsync_python)
for side in "$old_src" .; do
  echo "# building ${targets[*]} in $side/build-ab" >&2
  cmake -S "$side" -B "$side/build-ab" -DCMAKE_BUILD_TYPE=Release -DGRADSYNC_CUDA=OFF -DGRADSYNC_BUILD_TESTS=OFF \
    >"$side/build-ab.configure.log" 2>&1 || { cat "$side/build-ab.configure.log"; exit 1; }
  cmake --build "$side/build-ab" -j "$(nproc)" --target "${targets[@]}" >"$side/build-ab.log" 2>&1 ||
    { tail -30 "$side/build-ab.log"; exit 1; }
done
out=$(mktemp -d)
echo "# raw results in $out (removed at the end)" >&2
measure() {  # PART SIDE-NAME SOURCE ROUND: one part's measurements for one side
  local bin=$3/build-ab/bin dir=$out/$2-$4 c s
  mkdir -p "$dir"
  case $1 in
    ps) for s in 1048576 16777216; do for c in 1x1 2x2; do
          "$bin/gradsync-bench-ps" --sizes=$s --configs=$c --repeats=5 --json="$dir/ps-$s-$c.json" >/dev/null
        done; done ;;
    processes) for s in 1048576 16777216; do for c in 1x1 2x2; do
          "$bin/gradsync-bench-ps" --processes --sizes=$s --configs=$c --small-keys=0 --repeats=3 \
            --json="$dir/psp-$s-$c.json" >/dev/null
        done; done ;;
    allreduce) for s in 4194304 67108864; do
          "$bin/gradsync-bench-allreduce" --sizes=$s --ranks=2,4 --iters=10 --json="$dir/ar-$s.json" >/dev/null
        done ;;
    trainstep) "$bin/gradsync-bench-train-step" --torch=off --repeats=3 --json="$dir/ts.json" >/dev/null ;;
    fmnist)
      timeout 900 "$bin/gradsync-launch" --mode=bsp --servers=2 --workers=4 --out="$dir/fmnist" -- --epochs=2 \
        >"$dir/fmnist.log" 2>&1 || { echo "ab_compare.sh: the Fashion-MNIST job of $2 failed:" >&2; tail -5 "$dir/fmnist.log" >&2; exit 1; } ;;
  esac
}
for ((r = 0; r < rounds; ++r)); do
  echo "# round $((r + 1))/$rounds ($(date -u +%T))" >&2
  for part in ps processes allreduce trainstep fmnist; do
    has $part || continue
    if ((r % 2 == 0)); then measure $part old "$old_src" "$r"; measure $part new . "$r"
    else measure $part new . "$r"; measure $part old "$old_src" "$r"; fi
  done
done
if has pytorch; then
  # compare.py interleaves the two builds' multi-worker allreduce and bsp runs itself, round by round.
  echo "# bench/pytorch/compare.py --rounds=$rounds, old build as the baseline ($(date -u +%T))" >&2
  /usr/bin/python3 bench/pytorch/compare.py --rounds="$rounds" --bin-dir="$PWD/build-ab/bin" \
    --baseline-bin-dir="$PWD/$old_src/build-ab/bin" --json="$out/pytorch.json" >"$out/pytorch.log" 2>&1 ||
    { echo "ab_compare.sh: bench/pytorch/compare.py failed:" >&2; tail -5 "$out/pytorch.log" >&2; exit 1; }
fi
echo "# gradsync A/B: old $(git rev-parse --short "$rev"), new $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo '+uncommitted'); $rounds rounds alternated; parts $parts; $(machine)"
/usr/bin/python3 - "$out" "$rounds" <<'PY'
import glob, json, os, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def load(path):
    return json.load(open(path)) if os.path.exists(path) else None
def rows(side):
    """{measurement: [value of round 0, 1, ...]} for one side."""
    got = {}
    for r in range(rounds):
        d = f"{out}/{side}-{r}"
        for f in sorted(glob.glob(f"{d}/ps-*.json")):
            for x in load(f):
                if x["op"] == "push+pull" and not x["curve"]:
                    got.setdefault(f"ps push+pull {x['floats']} floats {x['servers']}x{x['workers']} (GB/s)", []).append(x["gbps"])
        for f in sorted(glob.glob(f"{d}/ar-*.json")):
            for x in load(f):
                got.setdefault(f"allreduce {x['bytes'] >> 20} MiB {x['ranks']} ranks (busbw GB/s)", []).append(x["busbw"])
        for x in (load(f"{d}/ts.json") or {"rows": []})["rows"]:
            got.setdefault(f"train step {x['model']} batch {x['batch']} (samples/s)", []).append(x["gradsync_median"])
        for f in sorted(glob.glob(f"{d}/psp-*.json")):
            for x in load(f)["ps"]:
                if x["op"] == "push+pull":
                    got.setdefault(f"ps processes {x['path']} {x['floats']} floats {x['servers']}x{x['workers']} (GB/s)", []).append(x["gbps"])
        w0 = load(f"{d}/fmnist/worker-0.json")
        if w0:
            got.setdefault("fmnist bsp 2x4 job (samples/s)", []).append(int(w0["steps"]) * 64 * 4 / w0["wall_s"])
    return got
old, new = rows("old"), rows("new")
torch = load(f"{out}/pytorch.json")
if torch:
    for mode, mine, base in (("allreduce", "gradsync allreduce, 4 workers", "baseline allreduce, 4 workers"),
                             ("bsp", "gradsync bsp, 4 workers, 2 servers", "baseline bsp, 4 workers, 2 servers")):
        if mine in torch["rates"] and base in torch["rates"]:
            new[f"compare.py {mode} 4 workers (samples/s)"] = torch["rates"][mine]
            old[f"compare.py {mode} 4 workers (samples/s)"] = torch["rates"][base]
print(f"{'measurement':<52} {'old':>12} {'new':>12} {'new/old':>8} {'paired':>8}")
worst = None
for k in old:
    o, n = old[k], new[k]
    ratio = statistics.median(n) / statistics.median(o)
    paired = statistics.median(b / a for a, b in zip(o, n))
    worst = paired if worst is None else min(worst, paired)
    print(f"{k:<52} {statistics.median(o):>12.4g} {statistics.median(n):>12.4g} {ratio:>8.3f} {paired:>8.3f}")
print(f"# worst paired ratio {worst:.3f} ({'within' if worst >= 0.97 else 'OUTSIDE'} 3%)")
PY
rm -rf "$out"
