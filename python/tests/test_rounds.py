"""Local SGD and DiLoCo (--sync-every) through gradsync.torch: the wrapped optimizer steps each
worker's own model, every H steps the pseudo-gradients are averaged (PS: the shards, all-reduce:
every rank) and the outer SGD applied; against the same written out in plain PyTorch
(train_worker.reference_rounds)."""

import json

import pytest
import torch

import gsjob
import train_worker


def rel_diff(got, ref):
    return ((got - ref).abs().max() / ref.abs().max()).item()


def total_bytes(record):
    last = record["steps"][-1]
    return last["bytes_sent"] + last["bytes_received"] + last["shm_bytes_sent"] + last["shm_bytes_received"]


def train(tmp_path, mode, workers, args, env):
    tmp_path.mkdir(parents=True, exist_ok=True)
    save = str(tmp_path / "params.pt")
    record = str(tmp_path / "record")
    full = ["--workers=%d" % workers, "--save=" + save, "--record=" + record] + args
    gsjob.run_job("train_worker.py", full, mode, workers, servers=2, out=str(tmp_path / "out"),
                  worker_env={r: env for r in range(workers)})
    records = [json.load(open("%s-%d.json" % (record, r))) for r in range(workers)]
    return torch.load(save), train_worker.parse(full), records


@pytest.mark.parametrize("mode", ["bsp", "allreduce"])
def test_local_sgd_averages_the_models_every_h_steps(tmp_path, mode):
    got, args, records = train(tmp_path, mode, 2, ["--steps=42", "--momentum=0.9"], {"GRADSYNC_SYNC_EVERY": "4"})
    ref = train_worker.reference_rounds(args, 4)
    assert rel_diff(got, ref) <= 1e-5
    assert records[0]["sync"] == ("rounds-ps" if mode == "bsp" else "rounds-allreduce")
    # Both workers end on the global model.
    assert records[0]["params"] == records[1]["params"]
    # Not what training without rounds computes.
    assert rel_diff(got, train_worker.reference(args)) > 1e-3
    # 11 exchanges in 42 steps: about 42/11 times fewer bytes than an exchange every step.
    _, _, every_step = train(tmp_path / "every", mode, 2, ["--steps=42", "--momentum=0.9"], {})
    ratio = total_bytes(every_step[0]) / total_bytes(records[0])
    assert 42 / 11 * 0.8 <= ratio <= 42 / 11 * 1.2, ratio


@pytest.mark.parametrize("mode", ["bsp", "allreduce"])
def test_diloco_applies_an_outer_nesterov_step_to_adamw_workers(tmp_path, mode):
    # AdamW is no optimizer the shards know: with rounds it runs in the worker, the shards run the outer SGD.
    env = {"GRADSYNC_SYNC_EVERY": "8", "GRADSYNC_OUTER_LR": "0.7", "GRADSYNC_OUTER_MOMENTUM": "0.9",
           "GRADSYNC_OUTER_NESTEROV": "true"}
    got, args, _ = train(tmp_path, mode, 2, ["--steps=40", "--optimizer=adamw", "--lr=0.01", "--weight-decay=0.01"],
                         env)
    ref = train_worker.reference_rounds(args, 8, outer_lr=0.7, outer_momentum=0.9, outer_nesterov=True)
    assert rel_diff(got, ref) <= 1e-5
    assert rel_diff(got, train_worker.reference_rounds(args, 8)) > 1e-3


def test_asp_rounds_finish_with_a_straggler(tmp_path):
    got, _, records = train(tmp_path, "asp", 2, ["--steps=40", "--straggler-rank=1", "--straggler-ms=4"],
                            {"GRADSYNC_SYNC_EVERY": "5"})
    assert torch.isfinite(got).all()
    staleness = [s["clock_staleness"] for s in records[0]["steps"] if s.get("clock_staleness") is not None]
    assert staleness and max(staleness) <= 8  # rounds, not steps
