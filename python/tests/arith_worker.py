"""A worker for test_arithmetic.py: runs DistributedOptimizer cases one after another in one job
(mode allreduce: one optimizer per case; the PS modes take one optimizer per job, so there each
job runs one case) and writes RESULT-<rank>.json: per case, the flat parameters before the first
step and after each step. The test recomputes every step with plain torch (the gradients of each
rank's batch, from batch() and build() below) and compares.

Each case is a comma-separated list of key=value: name (required), model (mlp: two layers, four
tensors; flat: one tensor of 120 values, so that a codec's unit is the whole gradient), op
(Average|Sum|Adasum), predivide, passes (backward_passes_per_step), compression (the Compression
object: fp16 is Compression.fp16, topk:0.1 Compression.topk(0.1)), sync (1: synchronize() then
skip_synchronize(): step()), steps, and join_steps (the job's last rank runs this many steps, the
others `steps`; everyone ends with gs.join())."""

import argparse
import json

import torch
import torch.nn.functional as F

LR = 0.5
ROWS = 4  # per rank, per backward pass
DEFAULTS = dict(model="mlp", op="Average", predivide="1", passes="1", compression="none", sync="0", steps="2",
                join_steps="-1")


def parse_case(text):
    case = dict(DEFAULTS)
    for item in text.split(","):
        k, v = item.split("=", 1)
        case[k] = v
    return case


def build(kind):
    """The model every rank starts from (seeded; the same everywhere)."""
    torch.manual_seed(3)
    if kind == "flat":
        return torch.nn.Linear(40, 3, bias=False)
    return torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3))


def batch(kind, rank, step, micro):
    """Rank `rank`'s batch of backward pass `micro` of step `step`."""
    g = torch.Generator().manual_seed(1000 * rank + 10 * step + micro + 7)
    dim = 40 if kind == "flat" else 8
    return torch.randn(ROWS, dim, generator=g), torch.randn(ROWS, 3, generator=g)


def loss_of(model, x, y):
    return F.mse_loss(model(x), y)


def flat(model):
    return [float(v) for v in torch.cat([p.detach().reshape(-1) for p in model.parameters()])]


def compressor(gs, spec):
    """The Compression object of `spec`: "fp16" is gs.Compression.fp16, "topk:0.1" gs.Compression.topk(0.1)."""
    name, _, arg = spec.partition(":")
    if not arg:
        return getattr(gs.Compression, name)
    return getattr(gs.Compression, name)(int(arg) if name == "qsgd" else float(arg))


def run_case(gs, case):
    rank, size = gs.rank(), gs.size()
    model = build(case["model"])
    opt = gs.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR), named_parameters=model.named_parameters(),
                                  op=getattr(gs, case["op"]), gradient_predivide_factor=float(case["predivide"]),
                                  backward_passes_per_step=int(case["passes"]),
                                  compression=compressor(gs, case["compression"]))
    steps = int(case["steps"])
    join_steps = int(case["join_steps"])
    if join_steps >= 0 and rank == size - 1:
        steps = join_steps
    params = [flat(model)]
    for s in range(steps):
        opt.zero_grad()
        for k in range(int(case["passes"])):
            x, y = batch(case["model"], rank, s, k)
            loss_of(model, x, y).backward()
        if case["sync"] == "1":
            opt.synchronize()
            with opt.skip_synchronize():
                opt.step()
        else:
            opt.step()
        params.append(flat(model))
    if join_steps >= 0:
        gs.join()
        params.append(flat(model))  # the parameters the job ended with
    else:
        opt.finish()
    return dict(case=case, params=params, sync_kind=opt.sync_kind)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--result", required=True)
    p.add_argument("cases", nargs="+")
    args = p.parse_args()
    import gradsync.torch as gs
    gs.init()
    out = {}
    for text in args.cases:
        case = parse_case(text)
        out[case["name"]] = run_case(gs, case)
    with open("%s-%d.json" % (args.result, gs.rank()), "w") as f:
        json.dump(out, f)
    gs.shutdown()


if __name__ == "__main__":
    main()
