#!/usr/bin/env python3
"""CPU time per step of real runs, by process role and thread, beside what gradsync-sim models.

Usage: bench/cpu_per_step.py SPEC RUN [RUN ...] [--steps=1000] [--seconds=4]

For each RUN of SPEC: runs it with gradsync-run (max_steps set to --steps and epochs raised so
that it stays in its steady state), waits until every worker is past step 100, then reads every
gradsync process's threads' CPU time (/proc/PID/task/TID/stat, user and system) at the start and
the end of a --seconds window, and divides by the steps each worker made in it. The rows are
per step of the whole job (every worker one step), summed over processes of a role: the main
thread, ZeroMQ's I/O threads and any other thread. Then simulates the same run with gradsync-sim
and prints its modelled CPU per step (workers' and servers' own threads, the kernel's copies).
Needs root when the run has a link { } (network namespaces). Clock ticks are 10 ms: a window of
a few seconds gives each row to about a tick over the steps in it.
"""
import argparse
import collections
import csv
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, os.environ.get("BUILD_DIR", "build"), "bin")
TICK = os.sysconf("SC_CLK_TCK")


def last_steps(out, run):
    """The last logged step of each worker of `run` under out/."""
    steps = []
    for f in glob.glob(f"{out}/*/{run}/worker-*.csv"):
        last = None
        with open(f) as fh:
            for row in csv.DictReader(fh):
                last = row
        steps.append(int(last["step"]) if last else 0)
    return steps


def snapshot():
    """CPU ticks of every gradsync server and worker thread, by (role, thread kind, user|sys)."""
    ticks = collections.Counter()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline") as fh:
                cmd = fh.read().split("\0")
            if not cmd[0].endswith(("gradsync-server", "gradsync-worker")):
                continue
            role = "worker" if cmd[0].endswith("worker") else ("scheduler" if "--role=scheduler" in cmd else "server")
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
                with open(f"/proc/{pid}/task/{tid}/comm") as fh:
                    comm = fh.read().strip()
                kind = "main" if tid == pid else ("zmq I/O" if comm.startswith("ZMQbg/IO") else "other")
                ticks[(role, kind, "user")] += int(fields[11])
                ticks[(role, kind, "sys")] += int(fields[12])
        except (FileNotFoundError, ProcessLookupError, IndexError):
            pass  # a thread or process that ended while being read
    return ticks


def measure(spec, run, seconds, tmp):
    out = os.path.join(tmp, "real")
    job = subprocess.Popen([os.path.join(BIN, "gradsync-run"), spec, f"--only={run}", f"--out={out}"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while True:
            steps = last_steps(out, run)
            if steps and min(steps) >= 100:
                break
            if job.poll() is not None:
                sys.exit(f"cpu_per_step: run '{run}' ended before step 100: {job.stderr.read().strip()[-400:]}")
            if time.time() > deadline:
                sys.exit(f"cpu_per_step: run '{run}' did not reach step 100 in 120 s")
            time.sleep(0.2)
        t0, s0, a = time.time(), last_steps(out, run), snapshot()
        time.sleep(seconds)
        t1, s1, b = time.time(), last_steps(out, run), snapshot()
        if job.poll() is not None:
            sys.exit(f"cpu_per_step: run '{run}' ended inside the window: raise --steps")
    finally:
        job.terminate()
        job.wait()
    steps = sum(s1) / len(s1) - sum(s0) / len(s0)  # per worker
    if steps <= 0:
        sys.exit(f"cpu_per_step: run '{run}' made no step in {seconds} s")
    per = 1000.0 / TICK / steps
    return 1000 * (t1 - t0) / steps, {k: (b[k] - a[k]) * per for k in b}


def modelled(spec, run, tmp):
    sim = subprocess.run([os.path.join(BIN, "gradsync-sim"), spec, f"--only={run}", f"--out={os.path.join(tmp, 'sim')}"],
                         capture_output=True, text=True)
    m = re.search(r"CPU modelled per step: ([\d.]+) core-ms \(workers ([\d.]+), servers ([\d.]+), kernel ([\d.]+)\)", sim.stdout)
    if not m:
        sys.exit(f"cpu_per_step: gradsync-sim gave no CPU figure for '{run}': {(sim.stderr or sim.stdout).strip()[-400:]}")
    return [float(x) for x in m.groups()]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("spec")
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--steps", type=int, default=1000, help="max_steps of the real run (default 1000)")
    ap.add_argument("--seconds", type=float, default=4, help="the measured window (default 4)")
    a = ap.parse_args()
    with open(a.spec) as fh:
        text = fh.read()
    # Long enough to measure the steady state: every max_steps set, one epoch per 30 s or so.
    text = re.sub(r"max_steps:\s*\d+", f"max_steps: {a.steps}", text)
    text = re.sub(r"epochs:\s*\d+", "epochs: 100", text)
    tmp = tempfile.mkdtemp(prefix="cpu_per_step.")
    spec = os.path.join(tmp, os.path.basename(a.spec))
    with open(spec, "w") as fh:
        fh.write(text)
    print(f"# CPU per step (every worker one step), core-ms: measured over {a.seconds:g} s past step 100 of a "
          f"{a.steps}-step run, and as gradsync-sim models it; {os.cpu_count()} cores")
    print("| run | step ms | workers main | workers I/O + other | servers main | servers I/O + other | "
          "measured total | modelled total | workers | servers | kernel |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    os.chdir(ROOT)  # the spec's compute_from and codec_from paths are relative to the checkout
    try:
        for run in a.runs:
            step_ms, cpu = measure(spec, run, a.seconds, tmp)
            model = modelled(spec, run, tmp)

            def part(role, main):
                return sum(v for (r, kind, _), v in cpu.items() if r == role and (kind == "main") == main)

            total = sum(cpu.values())
            print(f"| {run} | {step_ms:.2f} | {part('worker', True):.2f} | {part('worker', False):.2f} | "
                  f"{part('server', True):.2f} | {part('server', False):.2f} | {total:.2f} | {model[0]:.2f} | "
                  f"{model[1]:.2f} | {model[2]:.2f} | {model[3]:.2f} |", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
