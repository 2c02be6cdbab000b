"""A rank-0 checkpoint resumed by a new job, compared with the job that never stopped: the check
test_resume_horovod.py and test_resume_before_wrap.py run (state_worker.py is the worker).
bsp and all-reduce run 2 workers; ssp and asp one (their order of applying is the arrival order
with two), where broadcast_parameters has no other worker to send to but must still make the
loaded parameters the shards'."""

import torch

import gsjob

WORKERS = {"bsp": 2, "allreduce": 2, "ssp": 1, "asp": 1}


def resumes_bit_for_bit(tmp_path, mode, optimizer_args, horovod_order):
    """Runs 6 steps with a checkpoint after 3, then a new job from it (in Horovod's order: wrap,
    rank 0 loads, broadcast; else loading before wrapping), and asserts both end on the same bits."""
    workers = WORKERS[mode]
    ckpt, whole, resumed = (str(tmp_path / n) for n in ("ckpt.pt", "whole.pt", "resumed.pt"))
    common = optimizer_args + ["--steps=6", "--workers=%d" % workers, "--torch-api"]
    staleness = 2 if mode == "ssp" else None
    gsjob.run_job("state_worker.py", common + ["--checkpoint-at=3", "--checkpoint=" + ckpt, "--save=" + whole],
                  mode, workers, staleness=staleness, out=str(tmp_path / "out1"))
    resume = ["--first=3", "--resume=" + ckpt, "--save=" + resumed] + (["--horovod-order"] if horovod_order else [])
    gsjob.run_job("state_worker.py", common + resume, mode, workers, staleness=staleness, out=str(tmp_path / "out2"))
    a, b = torch.load(whole), torch.load(resumed)
    assert torch.equal(a, b), "the resumed job differs from the uninterrupted one (max %g)" % (a - b).abs().max()
    return torch.load(ckpt)["optimizer"]["state"]


def has_state(state):
    """The checkpoint holds optimizer state to resume (not all zeros)."""
    return bool(state) and all(float(e[k].abs().sum()) > 0 for e in state.values() for k in e if k != "step")
