"""DistributedDataParallel with gradsync's all-reduce hook computes what one process computes
with the global batch; broadcast_parameters puts worker 0's tensors everywhere (ring and PS)."""

import json

import torch

import gsjob
import train_worker


def test_ddp_with_the_gradsync_hook_equals_sgd_with_the_global_batch(tmp_path):
    save, record = str(tmp_path / "params"), str(tmp_path / "record")
    args = ["--workers=2", "--steps=60", "--save=" + save, "--record=" + record]
    gsjob.run_job("ddp_worker.py", args, "allreduce", 2, out=str(tmp_path / "out"))
    ref = train_worker.reference(train_worker.parse(args))
    got = [torch.load("%s-%d.pt" % (save, r)) for r in range(2)]
    assert torch.equal(got[0], got[1])  # every rank ends with the same bits
    assert ((got[0] - ref).abs().max() / ref.abs().max()).item() <= 1e-5
    for r in range(2):
        rec = json.load(open("%s-%d.json" % (record, r)))
        assert rec["a"] == [0.0, 0.0, 0.0] and rec["b"] == [0, 1, 2, 3, 4]
        assert rec["traffic"][0] > 0


def wide_hook_bytes(tmp_path, name, extra):
    # 30 steps of DDP over the wide MLP (20-512-4) with the hook: rank 0's bytes sent on the wire
    # (not through shared memory), and every rank's final parameters.
    save, record = str(tmp_path / name), str(tmp_path / (name + "-record"))
    args = ["--workers=2", "--steps=30", "--hidden=512", "--save=" + save, "--record=" + record] + extra
    tcp = {r: {"GRADSYNC_ALLREDUCE_SHM": "false"} for r in range(2)}
    gsjob.run_job("ddp_worker.py", args, "allreduce", 2, out=str(tmp_path / name), worker_env=tcp)
    return json.load(open(record + "-0.json"))["traffic"][0], [torch.load("%s-%d.pt" % (save, r)) for r in range(2)]


def test_the_hook_compresses(tmp_path):
    dense, _ = wide_hook_bytes(tmp_path, "dense", [])
    topk, got = wide_hook_bytes(tmp_path, "topk", ["--compression=topk:0.01", "--error-feedback"])
    assert torch.equal(got[0], got[1])
    assert topk < dense / 10


def test_broadcast_parameters_in_a_ps_mode_goes_through_the_scheduler(tmp_path):
    code = ("import gradsync.torch as gs, torch\n"
            "gs.init()\n"
            "t = {'big': torch.full((300000,), float(gs.rank())), 'small': torch.tensor([gs.rank() + 1.5])}\n"
            "gs.broadcast_parameters(t, root_rank=1)\n"
            "report([t['big'].min().item(), t['big'].max().item(), t['small'].item()], gs.rank())\n")
    assert gsjob.run_code(tmp_path, code, "bsp", 3) == [[1.0, 1.0, 2.5]] * 3


def test_the_hook_runs_powersgd_on_each_bucket_tensor(tmp_path):
    # Full rank (the MLP's matrices are 32 x 20 and 4 x 32): the dense average to rounding. Rank 2
    # on the wide MLP: every rank the same bits, a fraction of the dense bytes.
    save, record = str(tmp_path / "params"), str(tmp_path / "record")
    args = ["--workers=2", "--steps=40", "--save=" + save, "--record=" + record]
    gsjob.run_job("ddp_worker.py", args + ["--compression=powersgd:64", "--error-feedback"], "allreduce", 2,
                  out=str(tmp_path / "full"))
    ref = train_worker.reference(train_worker.parse(args))
    got = torch.load(save + "-0.pt")
    assert ((got - ref).abs().max() / ref.abs().max()).item() <= 1e-5
    dense, _ = wide_hook_bytes(tmp_path, "dense", [])
    low, got = wide_hook_bytes(tmp_path, "low", ["--compression=powersgd:2", "--error-feedback"])
    assert torch.equal(got[0], got[1])
    # 2(512 + 20) + 2(4 + 512) + the biases' 516 = 2,612 floats a step against 12,804 dense.
    assert low < dense / 4
