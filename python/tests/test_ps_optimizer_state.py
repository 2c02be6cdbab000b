"""The shards' optimizer state from Python (sync.optimizer_state() / set_optimizer_state()): its
form and its meaning (torch's own state), a rank-0 checkpoint that a new job resumes bit for bit,
and what is refused."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import gsjob
import state_worker
import train_worker

ARGS = {
    "sgd": ["--optimizer=sgd", "--momentum=0.9", "--nesterov", "--weight-decay=0.001"],
    "adam": ["--optimizer=adam", "--lr=0.01", "--weight-decay=0.001"],
}


def shapes():
    m = train_worker.model(state_worker.parse([]))
    return [p.numel() for p in m.parameters()]


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_a_rank0_checkpoint_resumes_bit_for_bit(tmp_path, kind):
    # 2 servers x 2 workers, bsp: the uninterrupted run writes a checkpoint (the next step's
    # parameters and the shards' state) after 4 of 8 steps; a new job resumes from it.
    ckpt, whole, resumed = (str(tmp_path / n) for n in ("ckpt.pt", "whole.pt", "resumed.pt"))
    common = ARGS[kind] + ["--steps=8", "--workers=2"]
    gsjob.run_job("state_worker.py", common + ["--checkpoint-at=4", "--checkpoint=" + ckpt, "--save=" + whole],
                  "bsp", 2, servers=2, out=str(tmp_path / "out1"))
    saved = torch.load(ckpt)
    state = saved["state"]
    assert state["kind"] == kind
    assert state["scalars"] == {"step": 4}  # one optimizer step per bsp round
    names = {"sgd": ["momentum_buffer"], "adam": ["exp_avg", "exp_avg_sq"]}[kind]
    assert sorted(state["slots"]) == sorted(names)
    for name in names:
        arrays = state["slots"][name]
        assert [a.size for a in arrays] == shapes()
        assert all(a.dtype == np.float32 and a.ndim == 1 for a in arrays)
        assert any(np.any(a != 0) for a in arrays)
    gsjob.run_job("state_worker.py", common + ["--first=4", "--resume=" + ckpt, "--save=" + resumed],
                  "bsp", 2, servers=2, out=str(tmp_path / "out2"))
    a, b = torch.load(whole), torch.load(resumed)
    assert torch.equal(a, b), "the resumed job differs from the uninterrupted one (max %g)" % (a - b).abs().max()


def torch_state(kind, steps):
    """torch's own optimizer state after `steps` steps of one process on train_worker's problem."""
    args = state_worker.parse(ARGS[kind] + ["--steps=%d" % steps])
    m = train_worker.model(args)
    opt = train_worker.optimizer(args, m.parameters())
    x, y = train_worker.data(args, steps * args.batch)
    for s in range(steps):
        opt.zero_grad()
        F.cross_entropy(m(x[s * args.batch:(s + 1) * args.batch]), y[s * args.batch:(s + 1) * args.batch]).backward()
        opt.step()
    return [opt.state[p] for p in m.parameters()]


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_the_state_means_what_torchs_state_means(tmp_path, kind):
    # One worker is torch's optimizer step for step: its state is torch's (momentum_buffer such
    # that p -= lr * buf; exp_avg, exp_avg_sq and step as torch.optim.Adam keeps them).
    ckpt = str(tmp_path / "ckpt.pt")
    gsjob.run_job("state_worker.py", ARGS[kind] + ["--steps=5", "--checkpoint-at=5", "--checkpoint=" + ckpt, "--stop"],
                  "bsp", 1, servers=2, out=str(tmp_path / "out"))
    state = torch.load(ckpt)["state"]
    ref = torch_state(kind, 5)
    for name, arrays in state["slots"].items():
        for got, want in zip(arrays, ref):
            want = want[name].reshape(-1).numpy()
            assert np.max(np.abs(got - want)) <= 1e-5 * max(1e-3, np.max(np.abs(want))), name
    if kind == "adam":
        assert all(int(r["step"]) == state["scalars"]["step"] for r in ref)


def test_before_the_first_step_the_state_is_empty_and_bad_states_are_refused(tmp_path):
    code = """
import numpy as np, torch
import gradsync.torch as gs
gs.init()
m = torch.nn.Linear(3, 2)
opt = gs.DistributedOptimizer(torch.optim.Adam(m.parameters(), lr=0.01), named_parameters=m.named_parameters())
sync = opt._gs_sync
out = {"empty": sync.optimizer_state()}
good = {"kind": "adam", "scalars": {"step": 2},
        "slots": {"exp_avg": [np.full(6, 0.5, np.float32), np.full(2, -0.5, np.float32)],
                  "exp_avg_sq": [np.full(6, 0.25, np.float32), np.full(2, 0.25, np.float32)]}}
def refused(state):
    try:
        sync.set_optimizer_state(state)
    except ValueError as e:
        return str(e)
    return None
out["refused"] = [
    refused(dict(good, kind="sgd")),
    refused(dict(good, slots={"exp_avg": good["slots"]["exp_avg"]})),
    refused(dict(good, slots=dict(good["slots"], momentum_buffer=good["slots"]["exp_avg"]))),
    refused(dict(good, slots=dict(good["slots"], exp_avg=[np.zeros(5, np.float32), np.zeros(2, np.float32)]))),
    refused(dict(good, slots=dict(good["slots"], exp_avg=good["slots"]["exp_avg"][:1]))),
    refused(dict(good, scalars={})),
    refused(dict(good, scalars={"step": 0})),
    refused(dict(good, scalars={"step": 1.5})),
    refused(dict(good, scalars={"lr": 1})),
    refused(dict(good, slots=dict(good["slots"], exp_avg_sq=[np.full(6, -1, np.float32), np.zeros(2, np.float32)]))),
    refused({"kind": "adam", "scalars": {"step": 3}, "slots": {}}),
]
out["after_refused"] = sync.optimizer_state()
sync.set_optimizer_state(dict(good, scalars={"step": torch.tensor(2.0)}))  # torch keeps its step as a tensor
back = sync.optimizer_state()
out["set"] = {"kind": back["kind"], "scalars": back["scalars"],
              "slots": {k: [a.tolist() for a in v] for k, v in back["slots"].items()}}
sync.set_optimizer_state({"kind": "adam", "scalars": {}, "slots": {}})  # torch's empty state: none taken
out["reset"] = sync.optimizer_state()
opt.finish(evaluate=False)
report(out, gs.rank())
"""
    out = gsjob.run_code(tmp_path, code, "bsp", 1)[0]
    assert out["empty"] == {"kind": "adam", "scalars": {}, "slots": {}}
    assert all(out["refused"]), out["refused"]
    for got, want in zip(out["refused"], ["this job's optimizer is adam", "'exp_avg_sq' is missing",
                                          "unknown optimizer state vector 'momentum_buffer'",
                                          "tensor 'weight': 5 values, the tensor has 6", "has 1 tensors",
                                          "'step' is missing", "'step' must be >= 1", "whole number",
                                          "unknown scalar 'lr'", "negative second moment",
                                          "a step count without the state vectors"]):
        assert want in got, (want, got)
    assert out["after_refused"] == out["empty"]
    assert out["set"] == {"kind": "adam", "scalars": {"step": 2},
                          "slots": {"exp_avg": [[0.5] * 6, [-0.5] * 2], "exp_avg_sq": [[0.25] * 6, [0.25] * 2]}}
    assert out["reset"] == out["empty"]


def test_outside_the_ps_modes_the_state_is_the_wrapped_optimizers(tmp_path):
    code = """
import torch
import gradsync.torch as gs
gs.init()
m = torch.nn.Linear(3, 2)
opt = gs.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9))
errors = []
for call in (lambda: opt._gs_sync.optimizer_state(),
             lambda: opt._gs_sync.set_optimizer_state({"kind": "sgd", "scalars": {}, "slots": {}})):
    try:
        call()
        errors.append(None)
    except ValueError as e:
        errors.append(str(e))
opt.finish(evaluate=False)
report(errors, gs.rank())
"""
    for errors in gsjob.run_code(tmp_path, code, "allreduce", 2):
        assert all(e and "the optimizer state lives in this process in mode allreduce" in e for e in errors), errors


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_state_dict_checkpoint_resumes_bit_for_bit(tmp_path, kind):
    # The same with torch's calls: rank 0 saves model.state_dict() and opt.state_dict(); the new
    # job's rank 0 loads them (load_state_dict sets the shards' state), then
    # broadcast_optimizer_state, as a Horovod script does.
    ckpt, whole, resumed = (str(tmp_path / n) for n in ("ckpt.pt", "whole.pt", "resumed.pt"))
    common = ARGS[kind] + ["--steps=8", "--workers=2", "--torch-api"]
    gsjob.run_job("state_worker.py", common + ["--checkpoint-at=4", "--checkpoint=" + ckpt, "--save=" + whole],
                  "bsp", 2, servers=2, out=str(tmp_path / "out1"))
    saved = torch.load(ckpt)["optimizer"]
    state = saved["state"]
    assert sorted(state) == list(range(len(shapes())))
    names = {"sgd": ["momentum_buffer"], "adam": ["exp_avg", "exp_avg_sq", "step"]}[kind]
    for entry, n in zip((state[i] for i in sorted(state)), shapes()):
        assert sorted(entry) == sorted(names)
        assert entry[names[0]].numel() == n
    if kind == "adam":
        assert float(state[0]["step"]) == 4
    gsjob.run_job("state_worker.py", common + ["--first=4", "--resume=" + ckpt, "--save=" + resumed],
                  "bsp", 2, servers=2, out=str(tmp_path / "out2"))
    a, b = torch.load(whole), torch.load(resumed)
    assert torch.equal(a, b), "the resumed job differs from the uninterrupted one (max %g)" % (a - b).abs().max()

