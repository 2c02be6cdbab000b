"""gradsync-launch runs a Python script as every worker, and the script's outputs are the C++
worker's: OUT/worker-<rank>.csv with the same columns and OUT/worker-<rank>.json summaries."""

import json
import os
import subprocess

import gsjob
from gradsync import _native


def test_gradsync_launch_runs_a_python_script_as_the_workers(tmp_path):
    out = str(tmp_path / "out")
    env = gsjob._clean_env()
    r = subprocess.run([os.path.join(gsjob.BIN_DIR, "gradsync-launch"), "--servers=2", "--workers=2", "--mode=ssp",
                        "--staleness=2", "--out=" + out, "--timeout=120",
                        "python3", os.path.join(gsjob.HERE, "train_worker.py"), "--steps=40"],
                       capture_output=True, text=True, env=env, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "80 gradients applied" in r.stdout, r.stdout
    for rank in range(2):
        with open(os.path.join(out, "worker-%d.csv" % rank)) as f:
            lines = f.read().splitlines()
        assert lines[0] == _native.METRICS_HEADER
        assert len(lines) == 1 + 40
        summary = json.load(open(os.path.join(out, "worker-%d.json" % rank)))
        assert summary["role"] == "worker" and summary["rank"] == rank and summary["mode"] == "ssp"
        assert summary["staleness_bound"] == 2 and int(summary["steps"]) == 40 and int(summary["params"]) == 804
        assert summary["ok"] is True and int(summary["bytes_sent"]) > 0


def test_a_traced_job_of_python_workers_has_the_frontend_and_user_spans(tmp_path):
    out = str(tmp_path / "out")
    r = subprocess.run([os.path.join(gsjob.BIN_DIR, "gradsync-launch"), "--servers=2", "--workers=2", "--mode=ssp",
                        "--staleness=2", "--out=" + out, "--timeout=120", "--trace",
                        "python3", os.path.join(gsjob.HERE, "train_worker.py"), "--steps=20"],
                       capture_output=True, text=True, env=gsjob._clean_env(), timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "trace: " + os.path.join(out, "trace.json") + " (5 processes" in r.stdout, r.stdout
    trace = json.load(open(os.path.join(out, "trace.json")))["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in trace if e["ph"] == "M" and e["name"] == "process_name"}
    assert sorted(names.values()) == ["scheduler 0", "server 0", "server 1", "worker 0", "worker 1"]
    for rank in range(2):
        pid = [p for p, n in names.items() if n == "worker %d" % rank][0]
        spans = {}
        for e in trace:
            if e["pid"] == pid and e["ph"] == "X":
                spans.setdefault(e["name"], []).append(e)
        # The user's span, the frontend's step (what Python computed between begin and finish), and
        # the native pushes and pulls, once per step (and per shard).
        assert len(spans["load batch"]) == 20 and spans["load batch"][0]["cat"] == "user"
        assert len(spans["forward + backward"]) == 20 and len(spans["begin step"]) == 20
        assert len(spans["push"]) >= 2 * 20 and len(spans["pull"]) >= 2 * 20
        assert all(s["args"]["bytes"] > 0 for s in spans["push"])
