#!/usr/bin/python3
"""Peak memory of gradsync's processes: one local worker, and a whole job of S servers and N
workers on this host (asp, the MLP, 1 epoch), summed over every process of the job.

Sampled every --interval seconds from /proc: two sums over the job's processes, resident (RSS:
every page a process has in memory, shared pages, such as a library's or a mapped dataset's,
counted in every process that maps them) and proportional (PSS: a page shared by k processes
counts 1/k in each, so the sum is what the job costs the machine); the machine's own view, how far
MemAvailable fell below its value before the job started (the page cache's copy of a shared
file included); and the largest single process's peak RSS (the kernel's high-water mark, VmHWM).
Run it on an otherwise idle machine: the fall counts everything else too.

  bench/memory.py [--bin-dir=build/bin] [--jobs=4x32] [--label=NAME] [-- EXTRA-WORKER-FLAGS]
  bench/memory.py --bin-dir=.ab/REV/build-ab/bin --label=before   # an older build, to compare
  GRADSYNC_MAX_STEPS=20 bench/memory.py --jobs=1x4 \
      --worker-command="/usr/bin/python3 examples/pytorch/train_cnn.py --epochs=1"   # Python workers

Prints a Markdown table, one row per case; --json writes the numbers.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def children_of(pid):
    """Every descendant of `pid` (from /proc/*/stat's parent ids), and pid itself."""
    parent = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            parent[int(entry)] = int(fields[1])
        except (OSError, IndexError, ValueError):
            continue
    family, grew = {pid}, True
    while grew:
        grew = False
        for p, pp in parent.items():
            if pp in family and p not in family:
                family.add(p)
                grew = True
    return family


def memory_kib(pid):
    """(rss, pss, hwm) in KiB of one process, or None when it has gone."""
    try:
        rss = pss = 0
        with open("/proc/%d/smaps_rollup" % pid) as f:
            for line in f:
                if line.startswith("Rss:"):
                    rss = int(line.split()[1])
                elif line.startswith("Pss:"):
                    pss = int(line.split()[1])
        hwm = 0
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    hwm = int(line.split()[1])
        return rss, pss, hwm
    except (OSError, ValueError):
        return None


def available_kib():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1])
    return 0


def measure(cmd, interval, env=None):
    """Runs `cmd`, sampling its process tree; returns the peaks (MiB) and its wall time."""
    baseline = available_kib()
    lowest = baseline
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    peak_rss = peak_pss = 0
    hwm = {}
    processes = 0
    while proc.poll() is None:
        rss = pss = 0
        family = children_of(proc.pid)
        processes = max(processes, len(family))
        for p in family:
            m = memory_kib(p)
            if m is None:
                continue
            rss += m[0]
            pss += m[1]
            hwm[p] = max(hwm.get(p, 0), m[2])
        peak_rss, peak_pss = max(peak_rss, rss), max(peak_pss, pss)
        lowest = min(lowest, available_kib())
        time.sleep(interval)
    err = proc.stderr.read().decode(errors="replace")
    if proc.returncode != 0:
        sys.exit("error: %s exited with %d:\n%s" % (" ".join(cmd), proc.returncode, err[-2000:]))
    return {
        "rss_sum_mib": peak_rss / 1024,
        "pss_sum_mib": peak_pss / 1024,
        "available_fell_mib": (baseline - lowest) / 1024,
        "largest_process_hwm_mib": max(hwm.values(), default=0) / 1024,
        "processes": processes,
        "wall_s": time.monotonic() - start,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin-dir", default="build/bin")
    p.add_argument("--jobs", default="4x32", help="comma-separated SERVERSxWORKERS jobs (default 4x32)")
    p.add_argument("--label", default="", help="names the rows (e.g. before / after)")
    p.add_argument("--interval", type=float, default=0.1, help="seconds between samples (default 0.1)")
    p.add_argument("--json", help="also write the numbers here")
    p.add_argument("--worker-command", default="",
                   help="the workers are this command (gradsync-launch's COMMAND; alone for the first row) "
                        "instead of gradsync-worker")
    p.add_argument("extra", nargs="*", help="more worker flags (after --)")
    a = p.parse_args()
    worker = os.path.join(a.bin_dir, "gradsync-worker")
    launch = os.path.join(a.bin_dir, "gradsync-launch")
    rows = []
    with tempfile.TemporaryDirectory() as out:
        common = ["--model=mlp", "--epochs=1"] + a.extra
        env = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(os.path.abspath(a.bin_dir)), "python"))
        if a.worker_command:
            common = a.worker_command.split()
            r = measure(common, a.interval, env)
        else:
            r = measure([worker, "--mode=local", "--out=" + os.path.join(out, "local")] + common, a.interval)
        rows.append(dict(case="1 local worker", **r))
        for job in filter(None, a.jobs.split(",")):
            servers, workers = (int(x) for x in job.split("x"))
            cmd = [launch, "--mode=asp", "--servers=%d" % servers, "--workers=%d" % workers,
                   "--out=" + os.path.join(out, job)] + ([] if a.worker_command else ["--"]) + common
            r = measure(cmd, a.interval, env)
            rows.append(dict(case="%d servers, %d workers (asp)" % (servers, workers), **r))
    print("| %scase | processes | peak RSS, summed (MiB) | peak PSS, summed (MiB) | MemAvailable fell (MiB) "
          "| largest process's peak RSS (MiB) | wall s |" % ("build | " if a.label else ""))
    print("|%s---|---|---|---|---|---|---|" % ("---|" if a.label else ""))
    for r in rows:
        print("| %s%s | %d | %.0f | %.0f | %.0f | %.0f | %.1f |" % (
            a.label + " | " if a.label else "", r["case"], r["processes"], r["rss_sum_mib"], r["pss_sum_mib"],
            r["available_fell_mib"], r["largest_process_hwm_mib"], r["wall_s"]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"label": a.label, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
