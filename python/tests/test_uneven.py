"""Uneven inputs in the PS modes: worker 1 runs 3 steps fewer than worker 0 (2 servers x 2
workers). Without join the worker left waiting fails at once with an error that names worker 1
and says to call join; with join on worker 1 both finish, and the final parameters (worker 1's
final pull, after worker 0's last step) are the same on both. asp never waits: it finishes
without join."""

import json
import os
import re

import pytest

import gsjob

STEPS, FEWER = 10, 3


def run(tmp_path, mode, join, staleness=None):
    env = {0: {"UNEVEN_STEPS": str(STEPS)},
           1: {"UNEVEN_STEPS": str(STEPS - FEWER), "UNEVEN_JOIN": "1" if join else "0"}}
    return gsjob.run_job("uneven_worker.py", [], mode, 2, servers=2, staleness=staleness, out=str(tmp_path / "out"),
                         timeout_s=120, worker_env=env, expect_ok=False)


def stamp(log, what):
    m = re.search(r"worker \d: %s[^\n]* at (\d+\.\d+)" % what, log)
    return float(m.group(1)) if m else None


@pytest.mark.parametrize("mode,staleness", [("bsp", None), ("ssp", 1)])
def test_without_join_the_waiting_worker_fails_at_once_naming_the_early_one(tmp_path, mode, staleness):
    out, logs, codes = run(tmp_path, mode, False, staleness)
    log0, log1 = gsjob.read_log(logs[0]), gsjob.read_log(logs[1])
    assert codes[0] != 0, log0
    assert "worker 1 ended training after %d steps" % (STEPS - FEWER) in log0, log0
    assert "gradsync.torch.join()" in log0, log0
    assert "GradsyncError" in log0, log0
    ended, failed = stamp(log1, "ran"), stamp(log0, "FAILED")
    assert ended is not None and failed is not None, (log0, log1)
    assert failed - ended < 30, "worker 0 failed %.1f s after worker 1 ended" % (failed - ended)
    # Worker 1's steps were all applied; it ends normally once worker 0 has failed.
    assert codes[1] == 0, log1


@pytest.mark.parametrize("mode,staleness", [("bsp", None), ("ssp", 1)])
def test_with_join_every_worker_finishes(tmp_path, mode, staleness):
    out, logs, codes = run(tmp_path, mode, True, staleness)
    assert codes == [0, 0], "\n".join(gsjob.read_log(l) for l in logs)
    p0 = json.load(open(os.path.join(out, "params-0.json")))
    p1 = json.load(open(os.path.join(out, "params-1.json")))
    assert p0 == p1  # both pulled the final parameters, after worker 0's last step


def test_asp_without_join_finishes(tmp_path):
    out, logs, codes = run(tmp_path, "asp", False)
    assert codes == [0, 0], "\n".join(gsjob.read_log(l) for l in logs)


# --- as a Horovod script ends: no finish(), no shutdown(); the process just exits ---

def run_exit(tmp_path, mode, staleness=None, fewer=FEWER):
    env = {0: {"UNEVEN_STEPS": str(STEPS), "UNEVEN_EXIT": "1"},
           1: {"UNEVEN_STEPS": str(STEPS - fewer), "UNEVEN_EXIT": "1"}}
    try:
        return gsjob.run_job("uneven_worker.py", [], mode, 2, servers=2, staleness=staleness, out=str(tmp_path / "out"),
                             timeout_s=45, worker_env=env, expect_ok=False)
    except gsjob.JobError as e:
        pytest.fail("the job did not end: a worker still waited 45 s for the one that exited (%s)" % e)


@pytest.mark.parametrize("mode,staleness", [("bsp", None), ("ssp", 1), ("allreduce", None)])
def test_a_worker_that_just_exits_early_fails_the_others_naming_it(tmp_path, mode, staleness):
    out, logs, codes = run_exit(tmp_path, mode, staleness)
    log0, log1 = gsjob.read_log(logs[0]), gsjob.read_log(logs[1])
    assert codes[0] != 0, log0
    assert re.search(r"worker 1 ended training( \(finish\(\)\))? after %d steps" % (STEPS - FEWER), log0), log0
    assert "gradsync.torch.join()" in log0, log0
    ended, failed = stamp(log1, "ran"), stamp(log0, "FAILED")
    assert ended is not None and failed is not None, (log0, log1)
    assert failed - ended < 30, "worker 0 failed %.1f s after worker 1 ended" % (failed - ended)


@pytest.mark.parametrize("mode", ["bsp", "allreduce"])
def test_workers_that_just_exit_after_the_same_steps_end_the_job(tmp_path, mode):
    out, logs, codes = run_exit(tmp_path, mode, fewer=0)
    assert codes == [0, 0], "\n".join(gsjob.read_log(l) for l in logs)
    for r in range(2):
        assert json.load(open(os.path.join(out, "worker-%d.json" % r))).get("ok") is True, r
