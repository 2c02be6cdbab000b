"""Compression: the bytes a worker sends per step equal the codec's payload formula
(compression/compressor.h PayloadBytes, exposed as gradsync._native.encoded_bytes) times what the
path does with it, within 2% (the rest is message headers)."""

import json
import statistics

import pytest

import gsjob
from gradsync import _native


def bytes_per_step(tmp_path, mode, workers, codec):
    record = str(tmp_path / "record")
    # All-reduce over TCP: workers of one host would otherwise sum through shared memory, which
    # is not the wire these bytes count.
    # Over TCP (the wire these bytes count) and by the ring, whose bytes the formulas below are:
    # auto would pick recursive doubling or a tree at this size, which move other amounts.
    env = {r: {"GRADSYNC_ALLREDUCE_SHM": "false", "GRADSYNC_ALLREDUCE_ALGO": "ring"} for r in range(workers)} \
        if mode == "allreduce" else None
    gsjob.run_job("train_worker.py", ["--steps=30", "--hidden=4096", "--record=" + record, "--compression=" + codec,
                                      "--error-feedback"], mode, workers, servers=1, out=str(tmp_path / "out"),
                  worker_env=env)
    r = json.load(open(record + "-0.json"))
    sent = [s["bytes_sent"] for s in r["steps"]]
    # Mode allreduce: each step also all-reduces the frontend's small header (the workers' states
    # and which tensors got a gradient), counted apart.
    control = statistics.median(s.get("control_bytes_sent", 0) for s in r["steps"])
    assert control <= 512
    return statistics.median(b - a for a, b in zip(sent, sent[1:])) - control, r["num_params"]


RING_STEP_HEADER = 32  # bytes: each step of the ring sends one before its part


@pytest.mark.parametrize("codec,workers,factor,steps", [
    # all-gathered payloads: each rank forwards the other n-1 around the ring, in n-1 steps
    ("topk:0.01", 2, lambda n: n - 1, lambda n: n - 1),
    ("topk:0.01", 3, lambda n: n - 1, lambda n: n - 1),
    ("int8", 3, lambda n: n - 1, lambda n: n - 1),
    # summed inside the ring (reduce-scatter + all-gather): 2 (n-1) / n payloads in 2 (n-1) steps.
    # Three workers: with two, n - 1 = 2 (n-1) / n, and an all-gathered payload would pass for a
    # summed one.
    ("fp16", 3, lambda n: 2 * (n - 1) / n, lambda n: 2 * (n - 1)),
    ("randomk:0.01", 3, lambda n: 2 * (n - 1) / n, lambda n: 2 * (n - 1)),
])
def test_allreduce_bytes_per_step_follow_the_codec(tmp_path, codec, workers, factor, steps):
    measured, n = bytes_per_step(tmp_path, "allreduce", workers, codec)
    expected = factor(workers) * _native.encoded_bytes(codec, n) + steps(workers) * RING_STEP_HEADER
    assert measured == pytest.approx(expected, rel=0.01)


@pytest.mark.parametrize("codec", ["topk:0.01", "fp16"])
def test_ps_push_bytes_per_step_follow_the_codec(tmp_path, codec):
    measured, n = bytes_per_step(tmp_path, "bsp", 1, codec)
    assert measured == pytest.approx(_native.encoded_bytes(codec, n), rel=0.02)


def test_the_formula_is_not_the_raw_size():
    n = 102404
    assert _native.encoded_bytes("none", n) == 4 * n
    assert _native.encoded_bytes("fp16", n) < 0.51 * 4 * n
    assert _native.encoded_bytes("topk:0.01", n) < 0.03 * 4 * n


def test_powersgd_bytes_per_step_are_its_factors(tmp_path):
    # DistributedOptimizer(compression="powersgd:4") in mode allreduce, 3 workers, the MLP
    # 20-4096-4 (torch's weights [4096, 20] and [4, 4096]): two ring all-reduces a step, of
    # P and the biases (4*4096 + 4096 + 4*4 + 4) and of Q (4*20 + 4*4096), each 2(n-1)/n of its
    # floats and 2(n-1) step headers.
    measured, _ = bytes_per_step(tmp_path, "allreduce", 3, "powersgd:4")
    first, second = 4 * 4096 + 4096 + 4 * 4 + 4, 4 * 20 + 4 * 4096
    expected = 2 * 2 / 3 * 4 * (first + second) + 2 * 2 * 2 * RING_STEP_HEADER
    assert measured == pytest.approx(expected, rel=0.01)
