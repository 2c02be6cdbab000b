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
