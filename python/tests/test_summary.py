"""A Python worker's summary (OUT/worker-<rank>.json) agrees with its metrics file
(OUT/worker-<rank>.csv): steps, bytes on the wire and through shared memory are the last row's,
whether the worker's last row is its last step's (finish(): the row then holds what the end moved
too) or an evaluation's recorded after finish(). Both workers of each job share the host, so the
bytes through shared memory are not zero (bsp: the shard's lanes; all-reduce: the shared-memory
group). A script that gives no total_steps is not told it has 0 steps to train."""

import csv
import json
import os

import pytest

import gsjob

STEPS = 12
FIGURES = [("steps", "step"), ("bytes_sent", "bytes_sent"), ("bytes_received", "bytes_received"),
           ("shm_bytes_sent", "shm_bytes_sent"), ("shm_bytes_received", "shm_bytes_received")]


@pytest.fixture(scope="module", params=["bsp", "allreduce"])
def job(request, tmp_path_factory):
    # Worker 1 records an evaluation after finish(): its last row is that evaluation's.
    env = {0: {"UNEVEN_STEPS": str(STEPS)}, 1: {"UNEVEN_STEPS": str(STEPS), "UNEVEN_EVAL": "1"}}
    out, logs, _ = gsjob.run_job("uneven_worker.py", [], request.param, 2, servers=1,
                                 out=str(tmp_path_factory.mktemp(request.param)), timeout_s=60, worker_env=env)
    return request.param, out, logs


def test_every_summary_figure_is_the_last_rows(job):
    mode, out, _ = job
    for r in range(2):
        summary = json.load(open(os.path.join(out, "worker-%d.json" % r)))
        rows = list(csv.DictReader(open(os.path.join(out, "worker-%d.csv" % r))))
        last = rows[-1]
        assert (last["test_accuracy"] != "") == (r == 1), last
        assert last["test_auc"] == ("0.750000" if r == 1 else ""), last  # record_evaluation's test_auc
        for field, column in FIGURES:
            assert int(summary.get(field, 0)) == int(last[column]), (
                "%s, worker %d: the summary's %s is %s, the metrics file's last row's %s" % (
                    mode, r, field, summary.get(field, 0), last[column]))
        assert int(last["step"]) == STEPS, "%s, worker %d: the last row says step %s; it trained %d" % (
            mode, r, last["step"], STEPS)
        assert int(last["shm_bytes_sent"]) > 0 and int(last["shm_bytes_received"]) > 0, last
        # Every step has its row, in order.
        assert [int(row["step"]) for row in rows if row["test_accuracy"] == ""] == list(range(1, STEPS + 1))


def test_no_total_steps_is_not_zero_steps_to_train(job):
    mode, _, logs = job
    for log in logs:
        text = gsjob.read_log(log)
        assert "0 steps to train" not in text, text
        if mode != "allreduce":  # the line is the PS workers'
            assert "no total_steps given" in text, text
