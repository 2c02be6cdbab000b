#!/usr/bin/python3
"""ssp's row cache against ssp without it: the DLRM-style model on the click log, S servers and N
workers on this host through gradsync-launch (C++ workers), for each staleness bound s of --bounds
with --row-cache=true and =false, the two alternating (which goes first changes every round).

Per run, from the summaries the workers write (their own counts, ARCHITECTURE.md "Row cache"):
the rows pulled per step and the share of reads the cache served (over every worker), the bytes it
saved, samples/s of the job (every worker's samples / the slowest worker's wall time), the test
AUC after the same samples (worker 0's evaluation at the end), and the largest read staleness any
worker counted (at most s). Medians over --rounds where a run repeats.

  bench/tables/row_cache.py [--bin-dir=build/bin] [--bounds=1,3,8] [--servers=2] [--workers=4]
      [--rounds=1] [--json=FILE] [-- EXTRA-WORKER-FLAGS]

The default model: 26 tables of 10^6 ids (Zipf 1.05), dim 16, batch 64, one epoch of 100,000
samples (the click log's defaults). Run it on an otherwise idle machine.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def run(args, bound, cache, extra):
    out = tempfile.mkdtemp(prefix="gradsync-row-cache-")
    cmd = [os.path.join(args.bin_dir, "gradsync-launch"), "--mode=ssp", "--staleness=%d" % bound,
           "--servers=%d" % args.servers, "--workers=%d" % args.workers, "--out=" + out, "--",
           "--model=dlrm", "--epochs=1", "--row-cache=" + ("true" if cache else "false")] + extra
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1800)
    if done.returncode != 0:
        sys.exit("row_cache.py: the job failed (%s):\n%s" % (" ".join(cmd), done.stdout[-3000:]))
    workers = [json.load(open(os.path.join(out, "worker-%d.json" % w))) for w in range(args.workers)]
    steps = sum(int(w["steps"]) for w in workers)
    pulled = sum(int(w.get("rows_pulled", 0)) for w in workers)
    hits = sum(int(w.get("cache_hits", 0)) for w in workers)
    batch = 64
    for a in extra:
        if a.startswith("--batch="):
            batch = int(a.split("=", 1)[1])
    return {
        "bound": bound, "cache": cache,
        "rows_pulled_per_step": pulled / steps,
        "hit_rate": hits / max(1, hits + pulled),
        "saved_mib": sum(int(w.get("cache_saved_bytes", 0)) for w in workers) / 2**20,
        "samples_per_s": steps * batch / max(float(w["wall_s"]) for w in workers),
        "auc": float(workers[0].get("final_test_auc", float("nan"))),
        "max_read_staleness": max(int(w.get("max_read_staleness", -1)) for w in workers),
    }


def main():
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin-dir", default="build/bin")
    ap.add_argument("--bounds", default="1,3,8")
    ap.add_argument("--servers", type=int, default=2)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    bounds = [int(b) for b in args.bounds.split(",")]
    results = {}
    for r in range(args.rounds):
        for bound in bounds:
            for cache in ((True, False) if (r + bound) % 2 == 0 else (False, True)):
                got = run(args, bound, cache, extra)
                results.setdefault((bound, cache), []).append(got)
                print("# round %d, s=%d, cache %s: %.0f samples/s" % (r + 1, bound, "on" if cache else "off",
                                                                       got["samples_per_s"]), file=sys.stderr)
    print("ssp with and without the row cache: dlrm on the click log, %d servers x %d workers, %d round(s)%s"
          % (args.servers, args.workers, args.rounds, (", worker flags " + " ".join(extra)) if extra else ""))
    print()
    print("| s | row cache | rows pulled / step | reads served by the cache | MiB saved | samples/s | test AUC | "
          "largest read staleness |")
    print("|---|---|---|---|---|---|---|---|")
    rows = []
    for bound in bounds:
        for cache in (True, False):
            runs = results[(bound, cache)]
            med = {k: statistics.median(x[k] for x in runs) for k in runs[0] if k not in ("bound", "cache")}
            med["max_read_staleness"] = max(x["max_read_staleness"] for x in runs)
            rows.append(dict(med, bound=bound, cache=cache))
            print("| %d | %s | %.0f | %.1f%% | %.1f | %.0f | %.4f | %d |" % (
                bound, "on" if cache else "off", med["rows_pulled_per_step"], 100 * med["hit_rate"], med["saved_mib"],
                med["samples_per_s"], med["auc"], med["max_read_staleness"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
