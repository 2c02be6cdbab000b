"""A worker for the optimizer-state tests: train_worker's model, data and optimizer, trained with
gradsync.torch from global step --first to --steps. After --checkpoint-at steps it reads the
shards' optimizer state with the parameters of the next step (Horovod's rank-0 checkpoint: rank 0
writes both to --checkpoint); --resume starts from such a file (the parameters before the
optimizer is wrapped, the state set on the shards right after; with --torch-api --horovod-order,
Horovod's order: wrap, then rank 0 loads, then both broadcasts), and --stop ends the run at the
checkpoint. Rank 0 writes the final parameters to --save."""

import argparse
import sys

import torch
import torch.nn.functional as F

import train_worker


def parse(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--optimizer", default="sgd", choices=["sgd", "adam"])
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--nesterov", action="store_true")
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--first", type=int, default=0)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--checkpoint-at", type=int, default=-1)
    p.add_argument("--checkpoint", default="")
    p.add_argument("--stop", action="store_true")
    p.add_argument("--resume", default="")
    p.add_argument("--save", default="")
    p.add_argument("--torch-api", action="store_true",
                   help="checkpoint with model.state_dict() / opt.state_dict() and load_state_dict(), Horovod's way")
    p.add_argument("--horovod-order", action="store_true",
                   help="with --torch-api: resume as Horovod's scripts do: wrap the optimizer, then rank 0 loads the "
                        "model and optimizer state, then broadcast_parameters and broadcast_optimizer_state")
    return p.parse_args(argv)


def main():
    args = parse()
    import gradsync.torch as gs
    gs.init()
    rank, size = gs.rank(), gs.size()
    m = train_worker.model(args)
    ckpt = torch.load(args.resume) if args.resume else None
    if ckpt is not None and args.torch_api and not args.horovod_order:
        m.load_state_dict(ckpt["model"])
    elif ckpt is not None and not args.torch_api:
        torch.nn.utils.vector_to_parameters(ckpt["params"], m.parameters())
    opt = gs.DistributedOptimizer(train_worker.optimizer(args, m.parameters()), named_parameters=m.named_parameters())
    if ckpt is not None and args.horovod_order:
        # pytorch_imagenet_resnet50.py's order: wrapped already; rank 0 restores, then broadcasts.
        if rank == 0:
            m.load_state_dict(ckpt["model"])
            opt.load_state_dict(ckpt["optimizer"])
        gs.broadcast_parameters(m.state_dict(), root_rank=0)
        gs.broadcast_optimizer_state(opt, root_rank=0)
    elif ckpt is not None and args.torch_api:
        if rank == 0:
            opt.load_state_dict(ckpt["optimizer"])  # rank 0 loads; the shards hold one state for all
        gs.broadcast_optimizer_state(opt, root_rank=0)
    elif ckpt is not None:
        opt._gs_sync.set_optimizer_state(ckpt["state"])  # every rank, as load_state_dict on every rank
    global_batch = args.batch * size
    x, y = train_worker.data(args, args.steps * global_batch)
    for s in range(args.first, args.steps):
        rows = slice(s * global_batch + rank * args.batch, s * global_batch + (rank + 1) * args.batch)
        opt.zero_grad()
        F.cross_entropy(m(x[rows]), y[rows]).backward()
        opt.step()
        if s + 1 == args.checkpoint_at and args.torch_api:
            # Horovod's rank-0 checkpoint: the model's parameters (reading them waits for the
            # next step's pulls) and the optimizer's state_dict (the shards', after this step).
            model_state, opt_state = m.state_dict(), opt.state_dict()
            if rank == 0:
                torch.save({"model": model_state, "optimizer": opt_state}, args.checkpoint)
            if args.stop:
                break
        elif s + 1 == args.checkpoint_at:
            # The parameters of the next step (its pulls), and the state the shards reach once
            # every worker's push of this step is applied: together, where a new job goes on.
            opt.synchronize_parameters()
            state = opt._gs_sync.optimizer_state()
            if rank == 0:
                torch.save({"params": train_worker.flat(m), "state": state}, args.checkpoint)
            if args.stop:
                break
    opt.finish(evaluate=True)
    if args.save and rank == 0:
        torch.save(train_worker.flat(m), args.save)
    gs.shutdown()


if __name__ == "__main__":
    sys.exit(main())
