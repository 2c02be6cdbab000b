"""--precision with the PyTorch frontend: the gradient travels in the precision's 16 bits, and
gs.GradScaler's dynamic loss scaling makes every all-reduce rank skip the same overflowed steps
(it judges the averaged gradient) while PS workers unscale (or zero) their own before the push."""

import json
import statistics

import pytest

import gsjob
from gradsync import _native


def run(tmp_path, mode, workers, precision, initial_scale=None, steps=30, hidden=4096, extra=()):
    tmp_path.mkdir(parents=True, exist_ok=True)
    record = str(tmp_path / "record")
    env = {}
    for r in range(workers):
        env[r] = {"GRADSYNC_PRECISION": precision}
        if mode == "allreduce":
            env[r]["GRADSYNC_ALLREDUCE_SHM"] = "false"  # over TCP: the wire these bytes count
            env[r]["GRADSYNC_ALLREDUCE_ALGO"] = "ring"  # whose bytes the formula is (auto: rd or a tree here)
        if initial_scale is not None:
            env[r]["GRADSYNC_INITIAL_LOSS_SCALE"] = str(initial_scale)
    gsjob.run_job("train_worker.py", ["--steps=%d" % steps, "--hidden=%d" % hidden, "--record=" + record, "--amp"] + list(extra),
                  mode, workers, servers=1, out=str(tmp_path / "out"), worker_env=env)
    return [json.load(open("%s-%d.json" % (record, r))) for r in range(workers)]


def bytes_per_step(r):
    sent = [s["bytes_sent"] for s in r["steps"]]
    return statistics.median(b - a for a, b in zip(sent, sent[1:]))


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_allreduce_gradients_travel_in_16_bits(tmp_path, precision):
    workers = 3  # with two, summed (2 (n-1) / n) and all-gathered (n - 1) payloads are the same bytes
    records = run(tmp_path, "allreduce", workers, precision)
    n = records[0]["num_params"]
    # Summed inside the ring: 2 (n-1) / n of the 16-bit payload, as the fp16 codec.
    expect = 2 * (workers - 1) / workers * _native.encoded_bytes(precision, n)
    assert bytes_per_step(records[0]) == pytest.approx(expect, rel=0.02)


def test_allreduce_ranks_skip_the_same_overflowed_steps(tmp_path):
    records = run(tmp_path, "allreduce", 2, "fp16", initial_scale=1e12, steps=60, hidden=32)
    scales = [[s["loss_scale"] for s in r["steps"]] for r in records]
    skipped = [[s["skipped_steps"] for s in r["steps"]] for r in records]
    assert scales[0] == scales[1]
    assert skipped[0] == skipped[1]
    assert scales[0][0] == pytest.approx(1e12, rel=1e-6)
    assert 5 < skipped[0][-1] < 50  # 1e12 halves down to what these gradients fit in, then trains
    assert scales[0][-1] < 1e9
    assert records[0]["params"] == records[1]["params"]


def test_ps_pushes_16_bit_gradients_unscaled(tmp_path):
    # On the CPU the model computes in fp32 (torch 1.13's CPU autocast has no fp16), so a loss
    # scale of 1e12 overflows nothing before the push; the worker divides it out before the
    # gradient becomes fp16, or the shards would apply gradients 1e12 times too large.
    records = run(tmp_path / "scaled", "bsp", 1, "fp16", initial_scale=1e12, steps=40)
    n = records[0]["num_params"]
    assert bytes_per_step(records[0]) == pytest.approx(_native.encoded_bytes("fp16", n), rel=0.02)
    assert records[0]["steps"][-1]["skipped_steps"] == 0
    assert records[0]["steps"][-1]["loss_scale"] == pytest.approx(1e12, rel=1e-6)
    # Against the same job with a loss scale of 1: unscaled, the pushed fp16 gradients are the
    # same up to rounding, so the parameters end the same; gradients left scaled would blow
    # them up, and zeroed ones would leave them where the reference moved away from.
    reference = run(tmp_path / "unscaled", "bsp", 1, "fp16", initial_scale=1, steps=40)
    scaled, plain = records[0]["params"], reference[0]["params"]
    assert max(abs(a - b) for a, b in zip(scaled, plain)) <= 1e-3 * max(abs(v) for v in plain)
    # A rate too small to move any parameter: where they began.
    start = run(tmp_path / "start", "bsp", 1, "fp16", initial_scale=1, steps=40, extra=["--lr=1e-30"])[0]["params"]
    assert max(abs(a - b) for a, b in zip(plain, start)) > 100 * max(abs(a - b) for a, b in zip(scaled, plain))
