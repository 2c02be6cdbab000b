"""The PyTorch frontend's throughput against PyTorch DDP (gloo) and plain PyTorch, measured in one
run on this machine: the Fashion-MNIST CNN (454,922 parameters), batch 16 per worker, fixed
random batches, one thread per process (PyTorch's pool and the OpenBLAS it calls: frontend_worker.py
sets OPENBLAS_NUM_THREADS=1 before torch loads and checks it).

    /usr/bin/python3 bench/pytorch/compare.py [--rounds=3] [--workers=4] [--steps=150]
                                              [--baseline-bin-dir=DIR] [--baseline-env=VAR=VALUE,...]
                                              [--baseline-modes=allreduce,bsp]

Configurations (run in turn, ROUNDS times, interleaved): plain PyTorch (1 process); gradsync with
1 worker in allreduce and in bsp (1 server); the ceiling: WORKERS plain PyTorch processes side by
side with no communication at all (what this machine's cores give); DDP with gloo over WORKERS
processes; gradsync allreduce and bsp (2 servers) over WORKERS processes. Samples/s of a multi-process run = total
samples / the slowest rank's timed seconds. Prints the median [min..max] of each and the ratios
the frontend is judged by; --json writes them. --baseline-bin-dir: another build's bin/ (with
its python/ beside it, as gradsync-launch finds it) whose multi-worker allreduce and bsp runs
each run right beside this build's of the same mode (the baseline first on even rounds, second on
odd ones), with the median of the rounds' paired ratios beside the ratio of medians, for an A/B of a change in the same run; --baseline-env: the
baseline's runs with these variables set (GRADSYNC_OVERLAP=true: a setting's A/B, with this build
unless --baseline-bin-dir names another); --baseline-modes: which of the two get a baseline (bsp
alone for a PS setting such as GRADSYNC_BUSY_POLL_MS=0, which an all-reduce job refuses)."""

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


def run(config, args, bin_dir):
    env = None
    if len(config) > 5:
        bin_dir, extra = config[5]
        env = dict(os.environ, **extra)
    out = tempfile.mkdtemp(prefix="gradsync-bench-")
    worker = [sys.executable, os.path.join(HERE, "frontend_worker.py"), "--batch=%d" % args.batch,
              "--steps=%d" % args.steps, "--warmup=%d" % args.warmup, "--out=" + out]
    name, variant, mode, workers, servers = config[:5]
    try:
        if variant == "plain":
            # `workers` plain processes side by side, no communication: the machine's ceiling.
            procs = [subprocess.Popen(worker[:-1] + ["--out=%s/%d" % (out, w), "--variant=plain"]) for w in range(workers)]
            for p in procs:
                if p.wait(timeout=600) != 0:
                    raise RuntimeError("%s: a process failed" % name)
            for w in range(workers):
                os.rename("%s/%d/bench-0.json" % (out, w), "%s/bench-%d.json" % (out, w))
        else:
            launch = [os.path.join(bin_dir, "gradsync-launch"), "--mode=" + mode, "--workers=%d" % workers,
                      "--out=" + out + "/job", "--timeout=600"]
            if mode != "allreduce":
                launch.append("--servers=%d" % servers)
            subprocess.run(launch + worker + ["--variant=" + variant], check=True, timeout=660,
                           stdout=subprocess.DEVNULL, env=env)
        results = [json.load(open(os.path.join(out, f))) for f in os.listdir(out) if f.startswith("bench-")]
        if len(results) != workers:
            raise RuntimeError("%s: %d of %d workers reported" % (name, len(results), workers))
        return sum(r["samples"] for r in results) / max(r["seconds"] for r in results)
    finally:
        shutil.rmtree(out, ignore_errors=True)


def round_order(configs, r):
    """The configurations of round r: each baseline run right beside this build's run of the same
    mode, the baseline first on even rounds and second on odd ones, so that drift falls on both."""
    base = [c for c in configs if len(c) > 5]
    order = []
    for c in configs:
        if len(c) > 5:
            continue
        pair = [b for b in base if c[0] in (configs[5][0], configs[6][0]) and b[2] == c[2]]
        order += (pair + [c]) if pair and r % 2 == 0 else ([c] + pair)
    return order


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "bin"))
    p.add_argument("--baseline-bin-dir", default="")
    p.add_argument("--baseline-env", default="", help="VAR=VALUE,...: set for the baseline's runs")
    p.add_argument("--baseline-modes", default="allreduce,bsp", help="the runs with a baseline: allreduce, bsp or both")
    p.add_argument("--json", default="")
    args = p.parse_args()
    n = args.workers
    configs = [
        ("plain PyTorch, 1 process", "plain", None, 1, 0),
        ("gradsync allreduce, 1 worker", "gradsync", "allreduce", 1, 0),
        ("gradsync bsp, 1 worker, 1 server", "gradsync", "bsp", 1, 1),
        ("ceiling: %d plain processes, no comm" % n, "plain", None, n, 0),
        ("DDP gloo, %d workers" % n, "ddp", "allreduce", n, 0),
        ("gradsync allreduce, %d workers" % n, "gradsync", "allreduce", n, 0),
        ("gradsync bsp, %d workers, 2 servers" % n, "gradsync", "bsp", n, 2),
    ]
    extra = {}
    for item in filter(None, args.baseline_env.split(",")):
        if "=" not in item:
            p.error("--baseline-env: VAR=VALUE, not %r" % item)
        k, v = item.split("=", 1)
        extra[k] = v
    baseline_modes = [m for m in args.baseline_modes.split(",") if m]
    if not baseline_modes or any(m not in ("allreduce", "bsp") for m in baseline_modes):
        p.error("--baseline-modes: allreduce, bsp or allreduce,bsp, not %r" % args.baseline_modes)
    baseline = bool(args.baseline_bin_dir or extra)
    if baseline:
        where = (args.baseline_bin_dir or args.bin_dir, extra)
        if "allreduce" in baseline_modes:
            configs.append(("baseline allreduce, %d workers" % n, "gradsync", "allreduce", n, 0, where))
        if "bsp" in baseline_modes:
            configs.append(("baseline bsp, %d workers, 2 servers" % n, "gradsync", "bsp", n, 2, where))
    rates = {c[0]: [] for c in configs}
    for r in range(args.rounds):
        for c in round_order(configs, r):
            rate = run(c, args, args.bin_dir)
            rates[c[0]].append(rate)
            print("round %d/%d  %-36s %8.0f samples/s" % (r + 1, args.rounds, c[0], rate), flush=True)
    med = {k: statistics.median(v) for k, v in rates.items()}
    print("\n%-36s %10s  %s" % ("configuration", "samples/s", "median [min..max]"))
    for c in configs:
        v = rates[c[0]]
        print("%-36s %10.0f  [%.0f..%.0f]" % (c[0], med[c[0]], min(v), max(v)))
    plain, ceiling, ddp = med[configs[0][0]], med[configs[3][0]], med[configs[4][0]]
    ratios = {
        "allreduce / DDP (%d workers)" % n: med[configs[5][0]] / ddp,
        "bsp / DDP (%d workers)" % n: med[configs[6][0]] / ddp,
        "DDP / ceiling": ddp / ceiling,
        "allreduce / ceiling": med[configs[5][0]] / ceiling,
        "bsp / ceiling": med[configs[6][0]] / ceiling,
        "1-worker allreduce overhead vs plain": 1 - med[configs[1][0]] / plain,
        "1-worker bsp overhead vs plain": 1 - med[configs[2][0]] / plain,
    }
    for c in configs[7:]:
        mode = c[2]
        ratios["baseline %s / DDP" % mode] = med[c[0]] / ddp
        mine = rates[configs[5 if mode == "allreduce" else 6][0]]
        ratios["%s: this build / baseline" % mode] = statistics.median(mine) / med[c[0]]
        ratios["%s: this build / baseline, paired" % mode] = statistics.median(
            m / b for m, b in zip(mine, rates[c[0]]))
    print()
    for k, v in ratios.items():
        print("%-40s %s" % (k, ("%+.1f%%" % (100 * v)) if "overhead" in k else ("%.2fx" % v)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rates": rates, "median": med, "ratios": ratios}, f, indent=1)


if __name__ == "__main__":
    main()
