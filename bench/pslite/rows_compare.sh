#!/usr/bin/env bash
# gradsync against ps-lite on sparse push+pull of embedding rows, side by side in one run: the
# DLRM-style step's exchange (a batch of BATCH x FEATURES Zipf ids over IDS per table, each
# batch's unique rows pushed, waited, then pulled), the same rows on both sides (gradsync's
# workers draw the batches and write them as ps-lite keys), rounds alternating which goes first.
#
#   bench/pslite/rows_compare.sh PSLITE_DIR [--rounds=5] [--dims=16,64] [--configs=2x2]
#                                [--rows=4096x26] [--ids=100000000] [--repeats=5] [--iters=10]
#                                [--bin-dir=build/bin]
#
# Per round: gradsync-bench-ps --processes --rows on the zmq path (loopback TCP) and the shm path
# (co-located: the shards' lanes attached), then bench/pslite/run.sh --rows-keys on the same
# batches (ps-lite has one path: ZeroMQ over loopback TCP), or the other way round on odd rounds.
# Prints per dim and configuration the median rows/s of each over the rounds and gradsync over
# ps-lite: the ratio of the medians and the median of the rounds' paired ratios.
set -euo pipefail
cd "$(dirname "$0")/../.."
. bench/machine.sh
[[ $# -ge 1 && $1 != --* ]] || { sed -n '7,9p' "$0" | sed 's/^# \{0,3\}//' >&2; exit 2; }
pslite=$1
shift
rounds=5 dims=16,64 configs=2x2 rows=4096x26 ids=100000000 repeats=5 iters=10 bin=build/bin
for a in "$@"; do
  case "$a" in
    --rounds=*) rounds=${a#*=} ;;
    --dims=*) dims=${a#*=} ;;
    --configs=*) configs=${a#*=} ;;
    --rows=*) rows=${a#*=} ;;
    --ids=*) ids=${a#*=} ;;
    --repeats=*) repeats=${a#*=} ;;
    --iters=*) iters=${a#*=} ;;
    --bin-dir=*) bin=${a#*=} ;;
    *) echo "rows_compare.sh: unknown argument '$a'" >&2; exit 2 ;;
  esac
done
[[ -x $bin/gradsync-bench-ps ]] || { echo "rows_compare.sh: $bin/gradsync-bench-ps missing (scripts/build.sh)" >&2; exit 1; }
work=$(mktemp -d /tmp/rows-compare-XXXXXX)
trap 'rm -rf "$work"' EXIT
ours() {
  "$bin/gradsync-bench-ps" --processes --rows="$rows" --row-dims="$dims" --row-ids="$ids" --configs="$configs" \
    --paths=zmq,shm --repeats="$repeats" --iters="$iters" --row-keys-out="$work/keys" --json="$work/gradsync-$1.json" \
    >"$work/gradsync-$1.log" || { echo "rows_compare.sh: gradsync-bench-ps failed:" >&2; cat "$work/gradsync-$1.log" >&2; exit 1; }
}
theirs() {
  bench/pslite/run.sh "$pslite" --rows-keys="$work/keys" --dims="$dims" --configs="$configs" --repeats="$repeats" \
    --iters="$iters" --glibc-tunables --tsv="$work/pslite-$1.tsv" >"$work/pslite-$1.log" ||
    { echo "rows_compare.sh: ps-lite failed:" >&2; cat "$work/pslite-$1.log" >&2; exit 1; }
}
# The keys ps-lite reads come from gradsync's workers: the first round runs gradsync first.
for ((r = 0; r < rounds; ++r)); do
  echo "# round $((r + 1))/$rounds ($(date -u +%T))" >&2
  if ((r % 2 == 0)); then ours "$r"; theirs "$r"; else theirs "$r"; ours "$r"; fi
done
echo "# gradsync $(git rev-parse --short HEAD) against ps-lite $(git -C "$pslite" rev-parse --short HEAD 2>/dev/null || echo '?'):" \
     "sparse push+pull, batch $rows over $ids ids per table, $rounds rounds alternated, medians of $repeats repeats" \
     "of $iters ops each; $(machine)"
python3 - "$work" "$rounds" <<'EOF'
import json, statistics, sys
work, rounds = sys.argv[1], int(sys.argv[2])
ours, theirs = {}, {}
for r in range(rounds):
    for row in json.load(open(f"{work}/gradsync-{r}.json"))["rows"]:
        key = (row["dim"], f"{row['servers']}x{row['workers']}")
        ours.setdefault(key, {}).setdefault(row["path"], []).append(row["rows_per_s"])
        if row["wrong"]:
            sys.exit(f"rows_compare.sh: gradsync round {r}: {row['wrong']} wrong rows")
    for line in open(f"{work}/pslite-{r}.tsv"):
        _, dim, s, w, rate, _, _, wrong = line.split("\t")
        theirs.setdefault((int(dim), f"{s}x{w}"), []).append(float(rate))
        if int(wrong):
            sys.exit(f"rows_compare.sh: ps-lite round {r}: {wrong} wrong rows")
print()
print("| dim | servers x workers | path | gradsync rows/s | ps-lite rows/s | ratio of medians | paired ratio |")
print("|---|---|---|---|---|---|---|")
names = {"zmq": "TCP (ZeroMQ, loopback)", "shm": "co-located (lanes attached)"}
for key in sorted(ours):
    p = theirs[key]
    for path, g in sorted(ours[key].items(), key=lambda kv: kv[0] != "zmq"):
        paired = statistics.median(a / b for a, b in zip(g, p))
        print(f"| {key[0]} | {key[1]} | {names[path]} | {statistics.median(g):,.0f} | {statistics.median(p):,.0f} | "
              f"{statistics.median(g) / statistics.median(p):.2f}x | {paired:.2f}x |")
print()
print("Each round, rows/s in millions (gradsync zmq / shm / ps-lite):")
for key in sorted(ours):
    per = zip(ours[key].get("zmq", []), ours[key].get("shm", []), theirs[key])
    print(f"- dim {key[0]} {key[1]}: " + ", ".join(f"{a / 1e6:.2f} / {b / 1e6:.2f} / {c / 1e6:.2f}" for a, b, c in per))
EOF
