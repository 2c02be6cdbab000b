"""gradsync.torch computes what plain PyTorch computes: one worker in every PS mode equals
torch.optim.SGD step for step; N bsp workers (and N all-reduce workers with the user's own
optimizer) equal one process with the N-times batch."""

import json

import pytest
import torch

import gsjob
import train_worker


def rel_diff(got, ref):
    return ((got - ref).abs().max() / ref.abs().max()).item()


def train(tmp_path, mode, workers, args, servers=2, worker_env=None):
    save = str(tmp_path / "params.pt")
    record = str(tmp_path / "record")
    full = ["--workers=%d" % workers, "--save=" + save, "--record=" + record] + args
    gsjob.run_job("train_worker.py", full, mode, workers, servers=servers, out=str(tmp_path / "out"),
                  worker_env=worker_env)
    ref = train_worker.reference(train_worker.parse(full))
    records = [json.load(open("%s-%d.json" % (record, r))) for r in range(workers)]
    return torch.load(save), ref, records


@pytest.mark.parametrize("mode", ["bsp", "ssp", "asp"])
def test_one_worker_equals_torch_sgd(tmp_path, mode):
    got, ref, records = train(tmp_path, mode, 1, ["--steps=200", "--momentum=0.9"])
    assert rel_diff(got, ref) <= 1e-6
    assert records[0]["sync"] == "ps-overlap"  # pushes per parameter, pulls per parameter
    assert records[0]["views"], "parameters and gradients must be views of the flat buffers"


def test_one_worker_equals_torch_sgd_with_nesterov_and_weight_decay_without_overlap(tmp_path):
    got, ref, records = train(tmp_path, "bsp", 1, ["--steps=200", "--nesterov", "--weight-decay=0.01"],
                              worker_env={0: {"GRADSYNC_OVERLAP": "false"}})
    assert records[0]["sync"] == "ps"
    assert rel_diff(got, ref) <= 1e-6


def test_four_bsp_workers_equal_sgd_with_the_global_batch(tmp_path):
    got, ref, records = train(tmp_path, "bsp", 4, ["--steps=100"])
    assert rel_diff(got, ref) <= 1e-5
    assert all(r["views"] for r in records)


def test_four_allreduce_workers_with_adam_equal_adam_on_the_global_batch(tmp_path):
    # With overlap whatever the host's cores (its default is off where 4 workers outnumber them).
    got, ref, records = train(tmp_path, "allreduce", 4, ["--steps=100", "--optimizer=adam", "--lr=0.01"],
                              worker_env={r: {"GRADSYNC_OVERLAP": "true"} for r in range(4)})
    assert rel_diff(got, ref) <= 1e-5
    assert records[0]["sync"] == "allreduce-overlap"
    assert all(r["views"] for r in records)


def test_a_wrong_update_is_caught(tmp_path):
    # The comparison can fail: the reference with another learning rate is far away.
    got, _, _ = train(tmp_path, "bsp", 1, ["--steps=50"])
    other = train_worker.reference(train_worker.parse(["--steps=50", "--lr=0.045"]))
    assert rel_diff(got, other) > 1e-3


@pytest.mark.parametrize("mode", ["bsp", "ssp", "asp"])
def test_one_worker_with_server_side_adam_equals_torch_adam(tmp_path, mode):
    got, ref, _ = train(tmp_path, mode, 1, ["--steps=200", "--optimizer=adam", "--lr=0.01", "--weight-decay=0.001"])
    assert rel_diff(got, ref) <= 1e-6


def test_a_torch_lr_scheduler_drives_the_shards(tmp_path):
    # StepLR halves the rate every 40 steps: the shards apply the rate each push carries.
    got, ref, _ = train(tmp_path, "bsp", 1, ["--steps=200", "--lr-step=40"])
    assert rel_diff(got, ref) <= 1e-6
    constant = train_worker.reference(train_worker.parse(["--steps=200"]))
    assert rel_diff(got, constant) > 1e-3
