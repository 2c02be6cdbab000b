"""A worker for the tests: a small MLP on a seeded synthetic classification problem, trained with
gradsync.torch (run as every worker of a job), or with plain PyTorch (reference()). Worker r of N
takes rows [r*B, (r+1)*B) of each step's global batch of N*B rows, so N workers with batch B see
exactly the batch a single process sees with batch N*B."""

import argparse
import collections
import json
import math
import time

import torch
import torch.nn.functional as F


def parse(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--optimizer", default="sgd", choices=["sgd", "adam", "adamw", "rmsprop"])
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--nesterov", action="store_true")
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=16, help="per worker")
    p.add_argument("--workers", type=int, default=1, help="the reference's global batch is workers * batch")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--lr-step", type=int, default=0, help="StepLR(step_size=this, gamma=0.5) per step; 0: none")
    p.add_argument("--compression", default=None)
    p.add_argument("--error-feedback", action="store_true")
    p.add_argument("--amp", action="store_true", help="gs.autocast() and gs.GradScaler() (the job's --precision)")
    p.add_argument("--straggler-rank", type=int, default=-1)
    p.add_argument("--straggler-ms", type=float, default=0.0)
    p.add_argument("--save", default="", help="rank 0 writes the final parameters here (.pt)")
    p.add_argument("--record", default="", help="each rank writes its per-step stats to RECORD-<rank>.json")
    p.add_argument("--hidden-rank", type=int, default=-1, help="this rank builds a wider model (bad use)")
    p.add_argument("--rename-rank", type=int, default=-1, help="this rank names a layer differently (bad use)")
    return p.parse_args(argv)


DIM, CLASSES = 20, 4


def data(args, rows):
    g = torch.Generator().manual_seed(args.seed + 1000)
    x = torch.randn(rows, DIM, generator=g)
    teacher = torch.randn(DIM, CLASSES, generator=g)
    y = (x @ teacher).argmax(dim=1)
    return x, y


def model(args, hidden=None, rename=False):
    torch.manual_seed(args.seed)
    layers = [("fc1", torch.nn.Linear(DIM, hidden or args.hidden)), ("act", torch.nn.ReLU()),
              ("fc2" if not rename else "out", torch.nn.Linear(hidden or args.hidden, CLASSES))]
    return torch.nn.Sequential(collections.OrderedDict(layers))


def optimizer(args, params):
    if args.optimizer == "sgd":
        return torch.optim.SGD(params, lr=args.lr, momentum=args.momentum, nesterov=args.nesterov,
                               weight_decay=args.weight_decay)
    if args.optimizer == "adam":
        return torch.optim.Adam(params, lr=args.lr, weight_decay=args.weight_decay)
    if args.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=args.lr, weight_decay=args.weight_decay)
    return torch.optim.RMSprop(params, lr=args.lr)


def flat(m):
    return torch.cat([p.detach().reshape(-1).clone() for p in m.parameters()])


def reference(args):
    """Plain PyTorch, one process, global batch workers * batch: the final flat parameters."""
    m = model(args)
    opt = optimizer(args, m.parameters())
    sched = torch.optim.lr_scheduler.StepLR(opt, args.lr_step, 0.5) if args.lr_step else None
    global_batch = args.batch * args.workers
    x, y = data(args, args.steps * global_batch)
    for s in range(args.steps):
        xb, yb = x[s * global_batch:(s + 1) * global_batch], y[s * global_batch:(s + 1) * global_batch]
        opt.zero_grad()
        F.cross_entropy(m(xb), yb).backward()
        opt.step()
        if sched:
            sched.step()
    return flat(m)


def reference_rounds(args, every, outer_lr=1.0, outer_momentum=0.0, outer_nesterov=False):
    """Local SGD / DiLoCo in plain PyTorch: `workers` replicas, each with its own optimizer on its
    rows of each step's global batch; every `every` steps (and at the end) the global model takes
    an outer SGD step on the mean of (global - replica), and every replica restarts from it. The
    final flat global parameters."""
    replicas = [model(args) for _ in range(args.workers)]
    opts = [optimizer(args, m.parameters()) for m in replicas]
    global_model = model(args)
    outer = torch.optim.SGD(global_model.parameters(), lr=outer_lr, momentum=outer_momentum, nesterov=outer_nesterov)
    global_batch = args.batch * args.workers
    x, y = data(args, args.steps * global_batch)
    for s in range(args.steps):
        for r, (m, opt) in enumerate(zip(replicas, opts)):
            rows = slice(s * global_batch + r * args.batch, s * global_batch + (r + 1) * args.batch)
            opt.zero_grad()
            F.cross_entropy(m(x[rows]), y[rows]).backward()
            opt.step()
        if (s + 1) % every and s + 1 != args.steps:
            continue
        with torch.no_grad():
            for i, g in enumerate(global_model.parameters()):
                own = [list(m.parameters())[i] for m in replicas]
                g.grad = sum(g - o for o in own) / len(own)
        outer.step()
        with torch.no_grad():
            for m in replicas:
                for p, g in zip(m.parameters(), global_model.parameters()):
                    p.copy_(g)
    return flat(global_model)


def main():
    args = parse()
    import gradsync.torch as gs
    gs.init()
    rank, size = gs.rank(), gs.size()
    m = model(args, hidden=args.hidden + 8 if rank == args.hidden_rank else None, rename=rank == args.rename_rank)
    opt = gs.DistributedOptimizer(optimizer(args, m.parameters()), named_parameters=m.named_parameters(),
                                  compression=args.compression, error_feedback=args.error_feedback or None,
                                  steps_per_epoch=args.steps, total_steps=args.steps)
    sched = torch.optim.lr_scheduler.StepLR(opt, args.lr_step, 0.5) if args.lr_step else None
    scaler = gs.GradScaler() if args.amp else None
    global_batch = args.batch * size
    x, y = data(args, args.steps * global_batch)
    records = []
    for s in range(opt.steps, args.steps):
        with gs.trace_span("load batch"):  # the user's own span in the job's trace (--trace)
            rows = slice(s * global_batch + rank * args.batch, s * global_batch + (rank + 1) * args.batch)
            if rank == args.straggler_rank and args.straggler_ms > 0:
                time.sleep(args.straggler_ms / 1e3 * (0.5 + torch.rand(1).item()))
        opt.zero_grad()
        if args.amp:
            with gs.autocast():
                loss = F.cross_entropy(m(x[rows]), y[rows])
            scaler.scale(loss).backward()
            scaler.step(opt, loss=loss)
            scaler.update()
        else:
            loss = F.cross_entropy(m(x[rows]), y[rows])
            loss.backward()
            opt.step(loss=loss)
        if sched:
            sched.step()
        st = opt.last_stats
        records.append({k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in st.items()})
    # Every parameter and gradient is a view of the flat buffers (no copy), in layout order.
    views, offset = True, 0
    for p in m.parameters():
        views &= p.data_ptr() == opt.flat_parameters.data_ptr() + 4 * offset
        views &= p.grad.data_ptr() == opt.flat_gradients.data_ptr() + 4 * offset
        offset += p.numel()
    opt.finish(evaluate=True)
    if args.record:
        with open("%s-%d.json" % (args.record, rank), "w") as f:
            json.dump({"steps": records, "sync": opt.sync_kind, "traffic": opt.traffic(),
                       "params": [float(v) for v in opt.flat_parameters[:64]],
                       "views": views, "num_params": int(opt.flat_parameters.numel())}, f)
    if args.save and rank == 0:
        torch.save(flat(m), args.save)
    gs.shutdown()


if __name__ == "__main__":
    main()
