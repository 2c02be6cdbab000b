#!/usr/bin/python3
"""Seeds of a run side by side: reads an experiment's summary.json (gradsync-run's) and prints one
markdown row per run whose repeats differ only by seed, named RUN, RUN-seed1, RUN-seed2, ...:
the final accuracy's mean and range, the median wall time and time to the target (and how many
seeds reached it), bytes per worker and step and per sample (a worker's batch, read from the
run's commands), each run's seeds listed.

  /usr/bin/python3 bench/seed_table.py results/beyond/summary.json [--runs=allreduce,diloco16-ar]

A failed run is left out of its row and named below the table. Exit status 2 on a file that does
not read."""
import argparse
import json
import re
import statistics
import sys


def batch_of(run):
    for line in run.get("commands", []):
        m = re.search(r"(?:GRADSYNC_BATCH=|--batch=)(\d+)", line)
        if m:
            return int(m.group(1))
    return None


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("summary", help="an experiment's summary.json")
    p.add_argument("--runs", default="", help="comma-separated run names (without -seedN) in the order wanted; default: all")
    a = p.parse_args()
    try:
        with open(a.summary) as f:
            summary = json.load(f)
    except (OSError, ValueError) as e:
        print("seed_table.py: %s: %s" % (a.summary, e), file=sys.stderr)
        return 2
    target = summary.get("target_accuracy")
    groups, failed = {}, []
    for run in summary.get("run", []):
        stem = re.sub(r"-seed\d+$", "", run["name"])
        if not run.get("ok"):
            failed.append(run["name"])
            continue
        groups.setdefault(stem, []).append(run)
    order = [r for r in a.runs.split(",") if r] or list(groups)
    to = "time to %.0f%% (s)" % (100 * target) if target else "time to target (s)"
    print("| run | seeds | final acc, mean (min–max) | wall s, median | %s, median | bytes per worker and step | bytes per sample |" % to)
    print("|---|---|---|---|---|---|---|")
    for stem in order:
        runs = groups.get(stem)
        if not runs:
            print("| %s | none ended | | | | | |" % stem)
            continue
        acc = [100 * r["final_test_accuracy"] for r in runs if "final_test_accuracy" in r]
        wall = [r["wall_s"] for r in runs if "wall_s" in r]
        reached = [r["time_to_target_s"] for r in runs if "time_to_target_s" in r]
        bps = [r["bytes_per_step"] for r in runs if "bytes_per_step" in r]
        batch = batch_of(runs[0])
        seeds = ", ".join(r["name"][len(stem):].lstrip("-") or "seed0" for r in runs)
        acc_s = "%.2f%% (%.2f–%.2f)" % (statistics.mean(acc), min(acc), max(acc)) if acc else ""
        if len(acc) == 1:
            acc_s = "%.2f%%" % acc[0]
        reach_s = "%.0f" % statistics.median(reached) if reached else "not reached"
        if reached and len(reached) < len(runs):
            reach_s += " (%d of %d reached)" % (len(reached), len(runs))
        b = statistics.median(bps) if bps else None
        print("| %s | %d (%s) | %s | %s | %s | %s | %s |" % (
            stem, len(runs), seeds, acc_s, "%.0f" % statistics.median(wall) if wall else "", reach_s,
            "{:,.0f}".format(b) if b is not None else "", "{:,.0f}".format(b / batch) if b is not None and batch else ""))
    if failed:
        print("\nFailed, left out: " + ", ".join(failed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
