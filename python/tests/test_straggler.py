"""A spec's straggler reaches a Python worker: gradsync.torch sleeps --straggle (GRADSYNC_STRAGGLE,
as gradsync-run sets it) after each step's computation, as gradsync-worker does, and reports it
as the row's delay_ms."""

import json

import gsjob


def test_the_job_s_straggle_delay_is_slept_and_reported(tmp_path):
    record = str(tmp_path / "record")
    env = {1: {"GRADSYNC_STRAGGLE": "ms:25", "GRADSYNC_STRAGGLE_SEED": "3"}}
    gsjob.run_job("train_worker.py", ["--steps=12", "--record=" + record], "bsp", 2, out=str(tmp_path / "out"),
                  worker_env=env)
    slow = [s["delay_ms"] for s in json.load(open(record + "-1.json"))["steps"]]
    fast = [s["delay_ms"] for s in json.load(open(record + "-0.json"))["steps"]]
    # Never shorter than asked; once, not twice, per step. A sleep overslept by a busy machine
    # (one step of 25 ms took 96 under load) does not move the median.
    assert len(slow) == 12 and all(d >= 24 for d in slow), slow
    assert sorted(slow)[6] <= 40, slow
    assert all(d == 0 for d in fast), fast
