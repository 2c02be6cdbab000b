"""The DLRM-style model (examples/pytorch/train_dlrm.py's) through gradsync.torch against PyTorch
DDP (gloo) with nn.EmbeddingBag(sparse=True), measured in one run on this machine: 26 tables of
IDS rows x dim 32, batch 256 per worker, fixed batches of the click log made before the clock
starts, one thread per process, plain SGD (rows included) at lr 0.1 (dlrm_worker.py).

    /usr/bin/python3 bench/pytorch/dlrm_compare.py [--rounds=5] [--workers=4] [--ids=100000]
                                                   [--big-ids=1073741824] [--steps=100] [--json=FILE]

Configurations, each round in a rotated order so that drift falls on all of them: the ceiling
(WORKERS plain PyTorch processes side by side, no communication: what this machine's cores give),
DDP with gloo over WORKERS processes, gradsync bsp (2 servers: the rows on the shards) and
gradsync allreduce (the rows' sparse all-gather) over WORKERS processes. Samples/s of a run = total
samples / the slowest rank's timed seconds; the median [min..max] over the rounds, the ratios
against DDP and the ceiling from the medians, and rank 0's test AUC after the same steps.

Then the table DDP cannot hold: BIG_IDS ids per feature (2^30 x 32 floats = 128 GiB a table, each
process its own replica under DDP): DDP once (the processes' address space capped at the
machine's memory, so PyTorch's allocator refuses at once: its error is printed), gradsync bsp
once, training it (samples/s, the largest worker's peak resident set)."""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")


def run(name, variant, mode, workers, servers, ids, args):
    """One job; returns the per-rank results (dicts from bench-<rank>.json) and the job's exit code."""
    out = tempfile.mkdtemp(prefix="gradsync-dlrm-")
    worker = [sys.executable, os.path.join(HERE, "dlrm_worker.py"), "--variant=" + variant, "--ids=%d" % ids,
              "--steps=%d" % args.steps, "--warmup=%d" % args.warmup, "--out=" + out]
    try:
        if variant == "plain":
            procs = [subprocess.Popen(worker + ["--rank=%d" % w, "--size=%d" % workers, "--test=0"])
                     for w in range(workers)]
            code = max(p.wait(timeout=600) for p in procs)
        else:
            launch = [os.path.join(args.bin_dir, "gradsync-launch"), "--mode=" + mode, "--workers=%d" % workers,
                      "--out=" + out + "/job", "--timeout=600"]
            if mode != "allreduce":
                launch.append("--servers=%d" % servers)
            code = subprocess.run(launch + worker, timeout=660, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL).returncode
        results = [json.load(open(os.path.join(out, f))) for f in sorted(os.listdir(out)) if f.startswith("bench-")]
        return results, code
    finally:
        shutil.rmtree(out, ignore_errors=True)


def rate(name, results, code, workers):
    if code != 0 or len(results) != workers or any("error" in r for r in results):
        raise RuntimeError("%s: the job failed (exit %d, %d of %d workers reported)" % (name, code, len(results), workers))
    return sum(r["samples"] for r in results) / max(r["seconds"] for r in results)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--ids", type=int, default=100000, help="ids per feature in the compared runs (default 10^5)")
    p.add_argument("--big-ids", type=int, default=2**30, help="ids per feature of the table DDP cannot hold "
                   "(default 2^30; 0 skips that part)")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "bin"))
    p.add_argument("--json", default="")
    args = p.parse_args()
    n = args.workers
    configs = [
        ("ceiling: %d plain processes, no comm" % n, "plain", None, n, 0),
        ("DDP gloo, %d workers" % n, "ddp", "allreduce", n, 0),
        ("gradsync bsp, %d workers, 2 servers" % n, "gradsync", "bsp", n, 2),
        ("gradsync allreduce, %d workers" % n, "gradsync", "allreduce", n, 0),
    ]
    rates = {c[0]: [] for c in configs}
    aucs = {c[0]: [] for c in configs}
    for r in range(args.rounds):
        for c in configs[r % len(configs):] + configs[:r % len(configs)]:
            results, code = run(*c, args.ids, args)
            rates[c[0]].append(rate(c[0], results, code, c[3]))
            auc = next((x["auc"] for x in results if x.get("auc") is not None), None)
            if auc is not None:
                aucs[c[0]].append(auc)
            print("round %d/%d  %-36s %8.0f samples/s%s" % (r + 1, args.rounds, c[0], rates[c[0]][-1],
                                                            "  AUC %.4f" % auc if auc is not None else ""), flush=True)
    med = {k: statistics.median(v) for k, v in rates.items()}
    print("\n%d tables of %d ids x 32, batch 256 a worker, %d timed steps\n" % (26, args.ids, args.steps))
    print("%-36s %10s  %-18s %s" % ("configuration", "samples/s", "median [min..max]", "AUC (rank 0)"))
    for c in configs:
        v = rates[c[0]]
        print("%-36s %10.0f  [%.0f..%.0f]  %s" % (c[0], med[c[0]], min(v), max(v),
                                                  "%.4f" % statistics.median(aucs[c[0]]) if aucs[c[0]] else "-"))
    ceiling, ddp, bsp, ar = (med[c[0]] for c in configs)
    ratios = {"bsp / DDP": bsp / ddp, "allreduce / DDP": ar / ddp, "bsp / ceiling": bsp / ceiling,
              "allreduce / ceiling": ar / ceiling, "DDP / ceiling": ddp / ceiling}
    print()
    for k, v in ratios.items():
        print("%-36s %.2fx" % (k, v))
    big = {}
    if args.big_ids:
        gib = args.big_ids * 32 * 4 / 2**30
        print("\nthe table DDP cannot hold: %d ids x 32 a feature (%.0f GiB a table, 26 tables)" % (args.big_ids, gib))
        results, code = run("DDP, big table", "ddp", "allreduce", n, 0, args.big_ids, args)
        errors = sorted({x["error"] for x in results if "error" in x})
        big["ddp"] = {"exit": code, "errors": errors}
        print("  DDP gloo, %d workers: %s (exit %d)" % (n, "; ".join(errors) if errors else "no error written", code))
        results, code = run("gradsync bsp, big table", "gradsync", "bsp", n, 2, args.big_ids, args)
        big["bsp"] = {"samples_per_s": rate("gradsync bsp, big table", results, code, n),
                      "peak_rss_mib": max(x["peak_rss_mib"] for x in results),
                      "auc": next((x["auc"] for x in results if x.get("auc") is not None), None)}
        print("  gradsync bsp, %d workers, 2 servers: %.0f samples/s, largest worker peak RSS %.0f MiB, AUC %.4f"
              % (n, big["bsp"]["samples_per_s"], big["bsp"]["peak_rss_mib"], big["bsp"]["auc"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rates": rates, "median": med, "auc": aucs, "ratios": ratios, "big_table": big}, f, indent=1)


if __name__ == "__main__":
    main()
