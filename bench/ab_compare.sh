#!/usr/bin/env bash
# A/B of gradsync against an earlier commit, both built here and run alternately on one machine:
# gradsync-bench-ps (push+pull GB/s, 1M and 16M floats, 1x1 and 2x2), the same as real server and
# worker processes over every value channel (gradsync-bench-ps --processes: zmq, tcp, shm),
# gradsync-bench-allreduce (busbw, 4 MiB and 64 MiB, 2 and 4 ranks), gradsync-bench-train-step
# (samples/s, softmax and MLP at batch 64 and 256) and the 2x4 Fashion-MNIST bsp job (job
# samples/s, as bench/fmnist_ab.sh). A refactor must stay within 5% (ratio >= 0.95) in every row.
#   bench/ab_compare.sh REV [ROUNDS]      # default 5 rounds; REV built in .ab/REV (git worktree)
#   AB_PARTS=ps,processes,fmnist bench/ab_compare.sh REV   # only these parts (default: all of
#                                         # ps, processes, allreduce, trainstep, fmnist)
# Prints one row per measurement: the median over rounds of each side and new/old. Each round
# runs old then new, or new then old on odd rounds, so that drift falls on both alike.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/machine.sh
rev=${1:?usage: bench/ab_compare.sh REV [ROUNDS]}
rounds=${2:-5}
parts=${AB_PARTS:-ps,processes,allreduce,trainstep,fmnist}
has() { [[ ,$parts, == *,$1,* ]]; }
old_src=.ab/$(git rev-parse --short "$rev")
if [[ ! -d "$old_src" ]]; then
  mkdir -p .ab
  git worktree add --detach "$old_src" "$rev" >/dev/null
fi
targets=(gradsync-bench-ps gradsync-bench-allreduce gradsync-bench-train-step gradsync-server gradsync-worker
         gradsync-launch)
for side in "$old_src" .; do
  echo "# building ${targets[*]} in $side/build-ab" >&2
  cmake -S "$side" -B "$side/build-ab" -DCMAKE_BUILD_TYPE=Release -DGRADSYNC_CUDA=OFF -DGRADSYNC_BUILD_TESTS=OFF \
    >"$side/build-ab.configure.log" 2>&1 || { cat "$side/build-ab.configure.log"; exit 1; }
  cmake --build "$side/build-ab" -j "$(nproc)" --target "${targets[@]}" >"$side/build-ab.log" 2>&1 ||
    { tail -30 "$side/build-ab.log"; exit 1; }
done
out=$(mktemp -d)
run() {  # SIDE-NAME SOURCE ROUND
  local bin=$2/build-ab/bin dir=$out/$1-$3
  mkdir -p "$dir"
  if has ps; then "$bin/gradsync-bench-ps" --repeats=5 --json="$dir/ps.json" >/dev/null; fi
  if has allreduce; then
    "$bin/gradsync-bench-allreduce" --sizes=4194304,67108864 --ranks=2,4 --iters=10 --json="$dir/ar.json" >/dev/null
  fi
  if has trainstep; then "$bin/gradsync-bench-train-step" --torch=off --repeats=3 --json="$dir/ts.json" >/dev/null; fi
  if has processes; then "$bin/gradsync-bench-ps" --processes --small-keys=0 --repeats=3 --json="$dir/psp.json" >/dev/null; fi
  if has fmnist; then
    timeout 900 "$bin/gradsync-launch" --mode=bsp --servers=2 --workers=4 --out="$dir/fmnist" -- --epochs=2 \
      >"$dir/fmnist.log" 2>&1 || { echo "ab_compare.sh: the Fashion-MNIST job of $1 failed:" >&2; tail -5 "$dir/fmnist.log" >&2; exit 1; }
  fi
}
for ((r = 0; r < rounds; ++r)); do
  echo "# round $((r + 1))/$rounds" >&2
  if ((r % 2 == 0)); then run old "$old_src" "$r"; run new . "$r"; else run new . "$r"; run old "$old_src" "$r"; fi
done
echo "# gradsync A/B: old $(git rev-parse --short "$rev"), new $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo '+uncommitted'); $rounds rounds alternated; parts $parts; $(machine)"
python3 - "$out" "$rounds" <<'PY'
import json, os, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def load(path):
    return json.load(open(path)) if os.path.exists(path) else None
def rows(side):
    got = {}
    for r in range(rounds):
        d = f"{out}/{side}-{r}"
        for x in load(f"{d}/ps.json") or []:
            if x["op"] == "push+pull" and not x["curve"]:
                got.setdefault(f"ps push+pull {x['floats']} floats {x['servers']}x{x['workers']} (GB/s)", []).append(x["gbps"])
        for x in load(f"{d}/ar.json") or []:
            got.setdefault(f"allreduce {x['bytes'] >> 20} MiB {x['ranks']} ranks (busbw GB/s)", []).append(x["busbw"])
        for x in (load(f"{d}/ts.json") or {"rows": []})["rows"]:
            got.setdefault(f"train step {x['model']} batch {x['batch']} (samples/s)", []).append(x["gradsync_median"])
        for x in (load(f"{d}/psp.json") or {"ps": []})["ps"]:
            if x["op"] == "push+pull":
                got.setdefault(f"ps processes {x['path']} {x['floats']} floats {x['servers']}x{x['workers']} (GB/s)", []).append(x["gbps"])
        w0 = load(f"{d}/fmnist/worker-0.json")
        if w0:
            got.setdefault("fmnist bsp 2x4 job (samples/s)", []).append(int(w0["steps"]) * 64 * 4 / w0["wall_s"])
    return {k: statistics.median(v) for k, v in got.items()}
old, new = rows("old"), rows("new")
print(f"{'measurement':<52} {'old':>12} {'new':>12} {'new/old':>8}")
worst = None
for k in old:
    ratio = new[k] / old[k]
    worst = ratio if worst is None else min(worst, ratio)
    print(f"{k:<52} {old[k]:>12.4g} {new[k]:>12.4g} {ratio:>8.3f}")
print(f"# worst ratio {worst:.3f} ({'within' if worst >= 0.95 else 'OUTSIDE'} 5%)")
PY
rm -rf "$out"
