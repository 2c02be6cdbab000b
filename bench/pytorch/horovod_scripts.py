"""Horovod's and BytePS's own example scripts over gradsync, in every mode: the table of
python/README.md ("Horovod and BytePS scripts").

    /usr/bin/python3 bench/pytorch/horovod_scripts.py --scripts=DIR [--only=NAME,...] [--json=out.json]

DIR holds the four scripts as their projects ship them with only the import line and the data
loader changed (python/README.md gives the diff): pytorch_mnist.py and
pytorch_synthetic_benchmark.py (Horovod), train_mnist_byteps.py and benchmark_byteps.py
(BytePS). The scripts are not in this repository. The synthetic benchmarks need torchvision's
models (Debian's python3-torchvision) and Horovod's MNIST script filelock (python3-filelock).

Each script runs under gradsync-launch in mode allreduce (2 and 4 workers), bsp, ssp (s=2) and
asp (2 servers, 2 workers). A run passes when every worker exits 0; the table gives the
script's own figure (test accuracy, or total images/s), the wall time, and whether the workers
ended with identical parameters (the SHA-256 in each worker's summary), which all-reduce and bsp
guarantee and ssp and asp do not.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")

SCRIPTS = {
    "pytorch_mnist.py": ["--epochs", "1", "--no-cuda", "--log-interval", "1000"],
    "train_mnist_byteps.py": ["--epochs", "1", "--no-cuda", "--log-interval", "1000"],
    "pytorch_synthetic_benchmark.py": ["--no-cuda", "--model", "resnet18", "--batch-size", "8",
                                       "--num-warmup-batches", "2", "--num-batches-per-iter", "2", "--num-iters", "3"],
    "benchmark_byteps.py": ["--no-cuda", "--model", "resnet18", "--batch-size", "8", "--num-warmup-batches", "2",
                            "--num-batches-per-iter", "2", "--num-iters", "3"],
}
MODES = [("allreduce", 2, 0, None), ("allreduce", 4, 0, None), ("bsp", 2, 2, None), ("ssp", 2, 2, 2),
         ("asp", 2, 2, None)]


def figure(text):
    """The script's own last figure: test accuracy (%) or total images/s."""
    acc = re.findall(r"Accuracy: ([0-9.]+)%", text)
    if acc:
        return "accuracy %s%%" % acc[-1]
    rate = re.findall(r"Total img/sec on \d+ \w+\(s\): ([0-9.]+)", text)
    if rate:
        return "%s images/s" % rate[-1]
    return "?"


def run(bin_dir, scripts, name, mode, workers, servers, staleness):
    out = tempfile.mkdtemp(prefix="gradsync-compat-")
    cmd = [os.path.join(bin_dir, "gradsync-launch"), "--mode=" + mode, "--workers=%d" % workers, "--out=" + out,
           "--timeout=1200"]
    if mode != "allreduce":
        cmd.append("--servers=%d" % servers)
    if staleness is not None:
        cmd.append("--staleness=%d" % staleness)
    cmd += ["python3", os.path.join(scripts, name)] + SCRIPTS[name]
    start = time.time()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=scripts, timeout=1300)
    wall = time.time() - start
    digests = set()
    for r in range(workers):
        path = os.path.join(out, "worker-%d.json" % r)
        if os.path.exists(path):
            digests.add(json.load(open(path)).get("params_sha256", ""))
    return dict(script=name, mode=mode, workers=workers, servers=servers if mode != "allreduce" else 0,
                ok=p.returncode == 0, figure=figure(p.stdout), wall_s=round(wall, 1),
                identical=len(digests) == 1 and "" not in digests, out=out,
                tail="" if p.returncode == 0 else p.stdout[-2000:])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scripts", required=True)
    ap.add_argument("--only", default="", help="comma-separated script names")
    ap.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    names = [n for n in SCRIPTS if not args.only or n in args.only.split(",")]
    rows = []
    print("| script | mode | workers x servers | ran | figure | wall s | identical parameters |")
    print("|---|---|---|---|---|---|---|")
    for name in names:
        for mode, workers, servers, staleness in MODES:
            r = run(args.bin_dir, args.scripts, name, mode, workers, servers, staleness)
            rows.append(r)
            label = mode + (" s=%d" % staleness if staleness is not None else "")
            print("| %s | %s | %d x %d | %s | %s | %.1f | %s |" % (name, label, workers, r["servers"],
                                                              "yes" if r["ok"] else "FAILED", r["figure"], r["wall_s"],
                                                              "yes" if r["identical"] else "no"), flush=True)
            if not r["ok"]:
                print(r["tail"], file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    sys.exit(0 if all(r["ok"] for r in rows) else 1)


if __name__ == "__main__":
    main()
