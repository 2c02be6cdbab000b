#!/usr/bin/python3
"""A table far larger than any process: the DLRM-style model on the click log with 2^30 ids per
feature and rows of 32 floats (a dense table of one feature would be 128 GiB), trained by
S servers and N workers on this host in each of the given modes, through gradsync-launch: C++
workers (gradsync-worker --model=dlrm), or with --frontend=torch PyTorch workers running
examples/pytorch/train_dlrm.py (gradsync.torch.EmbeddingBag(2**30, 32) per feature), whose peak
resident set is also given above what `import torch` alone took in the same process.

For each run: every process's peak resident set (VmHWM, from the summaries the processes write),
the rows each shard holds and their memory, the test AUC and log loss reached beside the planted
model's (the best any model can reach on the same test set), samples/s and wall time.

  bench/tables/large_table.py [--bin-dir=build/bin] [--modes=bsp,asp] [--servers=2] [--workers=4]
      [--ids=1073741824] [--dim=32] [--features=26] [--train=200000] [--epochs=1] [--json=FILE]
      [--frontend=cpp|torch] [-- EXTRA-WORKER-FLAGS]

Prints a Markdown table per run. Run it on an otherwise idle machine (the timings share its cores).
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time


def summaries(out):
    found = {}
    for name in sorted(os.listdir(out)):
        m = re.match(r"(server|worker)-(\d+)\.json$", name)
        if m:
            with open(os.path.join(out, name)) as f:
                found[(m.group(1), int(m.group(2)))] = json.load(f)
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin-dir", default="build/bin")
    ap.add_argument("--modes", default="bsp,asp")
    ap.add_argument("--servers", type=int, default=2)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--ids", type=int, default=1 << 30)
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--features", type=int, default=26)
    ap.add_argument("--train", type=int, default=200000)
    ap.add_argument("--test", type=int, default=20000)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--json")
    ap.add_argument("--frontend", default="cpp", choices=["cpp", "torch"])
    args, extra = ap.parse_known_args()
    extra = [e for e in extra if e != "--"]
    launch = os.path.join(args.bin_dir, "gradsync-launch")
    results = []
    for mode in args.modes.split(","):
        out = tempfile.mkdtemp(prefix="large-table-%s-" % mode)
        servers = 0 if mode == "allreduce" else args.servers  # all-reduce: a replica per worker, no servers
        cmd = [launch, "--mode=" + mode, "--servers=%d" % servers, "--workers=%d" % args.workers, "--out=" + out]
        if args.frontend == "torch":
            script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "pytorch",
                                  "train_dlrm.py")
            cmd += ["python3", os.path.normpath(script), "--ids=%d" % args.ids, "--dim=%d" % args.dim,
                    "--features=%d" % args.features, "--train=%d" % args.train, "--test=%d" % args.test,
                    "--epochs=%d" % args.epochs] + extra
        else:
            cmd += ["--", "--model=dlrm", "--click-ids=%d" % args.ids, "--table-dim=%d" % args.dim,
                    "--click-features=%d" % args.features, "--click-train=%d" % args.train,
                    "--click-test=%d" % args.test, "--epochs=%d" % args.epochs] + extra
        print("# " + " ".join(cmd), flush=True)
        start = time.monotonic()
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=args.timeout)
        wall = time.monotonic() - start
        oracle = re.search(r"planted model's AUC ([0-9.]+) and log loss ([0-9.]+)", proc.stdout)
        epochs = re.findall(r"test_loss ([0-9.]+) .* test_auc ([0-9.]+)\s+samples/s\s+([0-9.]+)", proc.stdout)
        if proc.returncode != 0 or not epochs:
            sys.stdout.write(proc.stdout[-4000:])
            print("large_table.py: the %s run failed (exit %d)" % (mode, proc.returncode), file=sys.stderr)
            return 1
        s = summaries(out)
        torch_workers = {}
        for r in range(args.workers):
            path = os.path.join(out, "torch-worker-%d.json" % r)
            if os.path.exists(path):
                with open(path) as f:
                    torch_workers[r] = json.load(f)
                s[("worker", r)] = {"peak_rss_mib": torch_workers[r]["peak_rss_mib"]}
        row = {
            "frontend": args.frontend, "mode": mode, "servers": servers, "workers": args.workers, "ids": args.ids, "dim": args.dim,
            "features": args.features, "train": args.train, "epochs": args.epochs, "wall_s": round(wall, 1),
            "oracle_auc": float(oracle.group(1)) if oracle else None,
            "oracle_log_loss": float(oracle.group(2)) if oracle else None,
            "test_log_loss": float(epochs[-1][0]), "test_auc": float(epochs[-1][1]),
            # Worker 0's epoch line: its own samples over its training time (gradsync-worker's
            # and train_dlrm.py's alike); the job's is about that times the workers.
            "samples_per_s_per_worker": float(epochs[-1][2]),
            "job_samples_per_s": round(float(epochs[-1][2]) * args.workers),
            "workers_peak_rss_mib": [round(s[("worker", r)].get("peak_rss_mib", float("nan")), 1)
                                     for r in range(args.workers) if ("worker", r) in s],
            "servers_peak_rss_mib": [round(s[("server", r)].get("peak_rss_mib", float("nan")), 1)
                                     for r in range(args.servers) if ("server", r) in s],
            "servers_rows": [int(s[("server", r)].get("table_rows", 0)) for r in range(args.servers) if ("server", r) in s],
            "servers_table_mib": [round(s[("server", r)].get("table_mib", 0.0), 1)
                                  for r in range(args.servers) if ("server", r) in s],
        }
        if torch_workers:
            row["workers_peak_rss_above_torch_mib"] = [
                round(w["peak_rss_mib"] - w["torch_rss_mib"], 1) for _, w in sorted(torch_workers.items())]
            row["rows_per_step"] = [round(w["rows_per_step"]) for _, w in sorted(torch_workers.items())]
        results.append(row)
        print("| %s | value |" % mode)
        print("|---|---|")
        for k in ("test_auc", "oracle_auc", "test_log_loss", "oracle_log_loss", "samples_per_s_per_worker",
                  "job_samples_per_s", "wall_s",
                  "workers_peak_rss_mib", "workers_peak_rss_above_torch_mib", "rows_per_step", "servers_peak_rss_mib",
                  "servers_rows", "servers_table_mib"):
            if k in row:
                print("| %s | %s |" % (k, row[k]))
        print(flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
