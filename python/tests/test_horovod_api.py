"""Horovod's and BytePS's calls (hvd_worker.py, a script in their style) in every mode: the job
finishes, the ranks end with identical parameters where the mode makes them so, and each
collective returns what Horovod's does."""

import json
import os

import pytest
import torch

import gsjob


def run(tmp_path, mode, workers=2, servers=2, extra=(), staleness=None):
    result = str(tmp_path / "result")
    gsjob.run_job("hvd_worker.py", ["--result=" + result] + list(extra), mode, workers, servers=servers,
                  staleness=staleness, out=str(tmp_path / "out"), timeout_s=180)
    return [json.load(open("%s-%d.json" % (result, r))) for r in range(workers)]


def check_collectives(got):
    n = len(got)
    for r, g in enumerate(got):
        assert g["rank"] == r and g["size"] == n
        assert g["local_rank"] == r and g["local_size"] == n  # every worker on 127.0.0.1
        assert g["lr_after_broadcast"] == 0.05  # rank 0's, by broadcast_optimizer_state
        assert g["allreduce_sum"] == pytest.approx(n * (n + 1) / 2)
        assert g["allreduce_int"] == [3 * n * (n - 1) // 2]
        assert g["allreduce_2d"] == [[(n - 1) / 2] * 3] * 2
        assert g["allgather"] == [[float(k), float(k)] for k in range(n) for _ in range(k + 1)]
        assert g["broadcast"] == [float(n - 1)] * 3
        assert g["broadcast_"] == [0.0]
        assert g["broadcast_object"] == {"from": 1, "text": "xx"}
        assert g["allgather_object"] == [["rank", k] for k in range(n)]
        # The metric average is the same on every rank.
        assert g["avg_losses"] == got[0]["avg_losses"]


@pytest.mark.parametrize("mode,workers,staleness", [("allreduce", 2, None), ("allreduce", 4, None), ("bsp", 2, None),
                                                    ("ssp", 2, 1), ("asp", 2, None)])
def test_horovod_calls_in_every_mode(tmp_path, mode, workers, staleness):
    got = run(tmp_path, mode, workers=workers, staleness=staleness)
    check_collectives(got)
    # all-reduce: replicas; PS: finish() pulls the shards' final parameters on every worker.
    for g in got[1:]:
        assert g["params"] == got[0]["params"]
    summaries = [json.load(open(str(tmp_path / "out" / ("worker-%d.json" % r)))) for r in range(workers)]
    assert len({w["params_sha256"] for w in summaries}) == 1  # the digest of the same parameters
    if mode != "allreduce":
        # The workers count their replies as the shards count what they answered: the same totals
        # and histograms, from both ends.
        shards = [json.load(open(str(tmp_path / "out" / ("server-%d.json" % k)))) for k in range(2)]
        for field in ("pushes", "pulls"):
            assert sum(int(w.get(field, 0)) for w in summaries) == sum(int(k.get(field, 0)) for k in shards) > 0
        for field in ("version_lag", "clock_staleness"):
            def histogram(summaries):
                h = {}
                for x in summaries:
                    for b in x.get(field, []):
                        h[int(b.get("value", 0))] = h.get(int(b.get("value", 0)), 0) + int(b["count"])
                return h
            assert histogram(summaries) == histogram(shards)
    if mode == "allreduce":
        # --overlap's default: on unless the host runs more workers than it has cores, on every rank.
        assert {g["kind"] for g in got} == {"allreduce-overlap" if workers <= os.cpu_count() else "allreduce"}
        # A parameter no worker gave a gradient is not updated (weight decay included), as in torch.
        assert not got[0]["unused_moved"]


def test_byteps_calls(tmp_path):
    got = run(tmp_path, "bsp", extra=["--byteps"])
    check_collectives(got)
    assert got[1]["params"] == got[0]["params"]


def test_fp16_compression_and_predivide(tmp_path):
    got = run(tmp_path, "allreduce", extra=["--fp16-allreduce", "--predivide=2"])
    assert got[0]["kind"] == "allreduce"  # a codec: not the overlapped sync
    assert got[1]["params"] == got[0]["params"]


def test_sum_is_n_times_the_average(tmp_path):
    lr, wd = 0.05, 1e-3
    grads = {}
    for op in ("Average", "Sum"):
        got = run(tmp_path / op, "allreduce", extra=["--steps=1", "--op=" + op])
        w0, w1 = torch.tensor(got[0]["params0"]), torch.tensor(got[0]["params"])
        # One SGD step (the first: the momentum buffer is the gradient): w1 = w0 - lr * (g + wd * w0).
        grads[op] = ((w0 - w1) / lr - wd * w0)[:-12]  # the last 12: Net.unused, never updated
    assert grads["Average"].abs().max() > 1e-3
    assert torch.allclose(grads["Sum"], 2 * grads["Average"], rtol=1e-3, atol=1e-4)


def test_adasum_combines_the_updates_and_is_refused_by_the_shards(tmp_path):
    got = run(tmp_path, "allreduce", extra=["--op=Adasum", "--steps=4"])
    assert got[1]["params"] == got[0]["params"]
    # The shards cannot honour it: one clear error on every worker.
    _, logs, codes = gsjob.run_job("hvd_worker.py", ["--result=" + str(tmp_path / "ps"), "--op=Adasum"], "bsp", 2,
                                   servers=1, out=str(tmp_path / "ps-out"), timeout_s=120, expect_ok=False)
    assert all(codes)
    assert "op=Adasum: mode bsp cannot honour it" in gsjob.read_log(logs[0])


def test_adasum_rule():
    from gradsync.torch.collectives import adasum
    a = torch.tensor([1.0, 0.0])
    b = torch.tensor([0.0, 2.0])
    assert adasum([a, b]).tolist() == [1.0, 2.0]  # orthogonal: added
    assert adasum([a, a]).tolist() == [1.0, 0.0]  # parallel: averaged
    assert adasum([a, torch.zeros(2)]).tolist() == [1.0, 0.0]  # a zero (a joined worker) changes nothing
