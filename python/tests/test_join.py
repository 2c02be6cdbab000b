"""Uneven inputs in mode allreduce (hvd_worker.py --uneven: the last rank runs fewer steps): with
join() every worker finishes, the collectives in between still answer, and the replicas stay
identical; without it the workers still training fail at once, naming the early worker and
join()."""

import json
import time

import gsjob


def test_join_lets_every_worker_finish(tmp_path):
    result = str(tmp_path / "result")
    gsjob.run_job("hvd_worker.py", ["--result=" + result, "--steps=10", "--uneven=3", "--join"], "allreduce", 3,
                  out=str(tmp_path / "out"), timeout_s=120)
    got = [json.load(open("%s-%d.json" % (result, r))) for r in range(3)]
    assert [g["steps"] for g in got] == [10, 10, 7]
    for g in got:
        # The metric averages after rank 2 joined are over ranks 0 and 1 (it served them zeros).
        assert g["avg_losses"][:7] == got[0]["avg_losses"][:7]
        assert g["last_joined"] == 1  # the most steps, the highest rank
        assert g["params"] == got[0]["params"]  # the joined replica took the same updates
        assert g["allgather_object"] == [["rank", k] for k in range(3)]
    assert got[0]["avg_losses"][7:] == got[1]["avg_losses"][7:]


def test_finishing_early_fails_the_others_naming_the_worker(tmp_path):
    start = time.time()
    _, logs, codes = gsjob.run_job("hvd_worker.py", ["--result=" + str(tmp_path / "r"), "--steps=10", "--uneven=3"],
                                   "allreduce", 3, out=str(tmp_path / "out"), timeout_s=60, expect_ok=False)
    assert time.time() - start < 30
    assert all(codes)
    for log in logs[:2]:
        text = gsjob.read_log(log)
        assert "worker 2 ended training (finish()) after 7 steps" in text
        assert "gradsync.torch.join()" in text


def test_join_in_the_ps_modes_with_collectives_every_step(tmp_path):
    # hvd_worker averages its loss through the scheduler after every step: once rank 1 has joined
    # (left the consistency rule), those gathers go on among the others.
    for mode, staleness in (("bsp", None), ("ssp", 1), ("asp", None)):
        result = str(tmp_path / mode / "result")
        gsjob.run_job("hvd_worker.py", ["--result=" + result, "--steps=8", "--uneven=3", "--join"], mode, 2, servers=2,
                      staleness=staleness, out=str(tmp_path / mode / "out"), timeout_s=120)
        got = [json.load(open("%s-%d.json" % (result, r))) for r in range(2)]
        assert [g["steps"] for g in got] == [8, 5]
        assert got[0]["params"] == got[1]["params"]  # join pulled the final parameters
        assert got[0]["last_joined"] == got[1]["last_joined"] == 0
        assert got[1]["avg_losses"] == got[0]["avg_losses"][:5]


def test_a_worker_that_ended_fails_the_others_collectives_too(tmp_path):
    # ssp with a bound the early worker never blocks: the others' pulls go on, but the next
    # collective needs the worker that ended: the scheduler fails it, naming that worker.
    start = time.time()
    _, logs, codes = gsjob.run_job("hvd_worker.py", ["--result=" + str(tmp_path / "r"), "--steps=8", "--uneven=1"],
                                   "ssp", 2, servers=2, staleness=3, out=str(tmp_path / "out"), timeout_s=60,
                                   expect_ok=False)
    assert time.time() - start < 30
    text = gsjob.read_log(logs[0])
    assert codes[0] != 0, text
    assert "worker 1" in text and "ended training after 7 steps" in text and "join()" in text, text
