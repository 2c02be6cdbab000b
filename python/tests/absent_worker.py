"""A worker for the no-gradient tests: three linear layers, `always` used every step, `sometimes`
on even steps only, `never` not at all, trained with gradsync.torch (or, --reference, plain torch
in one process on every worker's rows at once: the bsp job's exact counterpart), each step begun
with zero_grad(set_to_none=--set-to-none). Rank 0 (or the reference) writes its final parameters
and its optimizer's state_dict() after the last step to --save."""

import argparse
import sys

import torch
import torch.nn.functional as F

DIM, CLASSES = 8, 4


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.always = torch.nn.Linear(DIM, CLASSES)
        self.sometimes = torch.nn.Linear(DIM, CLASSES)
        self.never = torch.nn.Linear(DIM, CLASSES)

    def forward(self, x, step):
        out = self.always(x)
        if step % 2 == 0:
            out = out + self.sometimes(x)
        return out


def parse(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--optimizer", default="sgd", choices=["sgd", "adam"])
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--compression", default="")
    p.add_argument("--set-to-none", action="store_true")
    p.add_argument("--reference", action="store_true")
    p.add_argument("--save", default="")
    return p.parse_args(argv)


def make_optimizer(args, params):
    if args.optimizer == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=0.01)
    return torch.optim.Adam(params, lr=0.01, weight_decay=0.01)


def main(argv=None):
    args = parse(argv)
    if args.reference:
        rank, size, gs = 0, args.workers, None
    else:
        import gradsync.torch as gs
        gs.init()
        rank, size = gs.rank(), gs.size()
    m = Model()
    opt = make_optimizer(args, m.parameters())
    if gs:
        opt = gs.DistributedOptimizer(opt, named_parameters=m.named_parameters(), compression=args.compression or None)
    g = torch.Generator().manual_seed(7)
    rows = args.batch * size
    x = torch.randn(args.steps * rows, DIM, generator=g)
    y = torch.randint(0, CLASSES, (args.steps * rows,), generator=g)
    state = None
    ps = bool(gs) and opt.sync_kind.startswith("ps")
    for s in range(args.steps):
        # The reference takes every worker's rows at once: its mean is the mean of their means.
        mine = slice(s * rows, (s + 1) * rows) if args.reference else \
            slice(s * rows + rank * args.batch, s * rows + (rank + 1) * args.batch)
        opt.zero_grad(set_to_none=args.set_to_none)
        F.cross_entropy(m(x[mine], s), y[mine]).backward()
        opt.step()
        if s + 1 == args.steps:
            state = opt.state_dict() if not ps else None
    params = {n: p.detach().clone() for n, p in m.named_parameters()}
    if gs:
        opt.finish(evaluate=True)
        params = {n: p.detach().clone() for n, p in m.named_parameters()}
        if ps:
            # The shards' state once every worker's pushes are applied: in asp another worker's
            # last push may still be in flight after this worker's last step.
            state = opt.state_dict()
    if args.save and rank == 0:
        names = [n for n, _ in m.named_parameters()]
        torch.save({"params": params, "state": {names[i]: v for i, v in state["state"].items()},
                    "init": {n: p.detach().clone() for n, p in Model().named_parameters()}}, args.save)
    if gs:
        gs.shutdown()


if __name__ == "__main__":
    sys.exit(main())
