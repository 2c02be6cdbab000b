"""A worker for test_ddp_hook.py: train_worker's model and data under DistributedDataParallel
with gradsync's all-reduce hook (and broadcast_parameters of a buffer-like tensor)."""

import json
import sys

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

import train_worker


def main():
    args = train_worker.parse(sys.argv[1:])
    import gradsync.torch as gs
    gs.init()
    rank, size = gs.rank(), gs.size()
    # broadcast_parameters: worker 0's values everywhere, whatever each worker had.
    extra = {"a": torch.full((3,), float(rank)), "b": torch.arange(5, dtype=torch.int64) * (rank + 1)}
    gs.broadcast_parameters(extra, root_rank=0)
    gs.init_process_group("gloo")
    model = DistributedDataParallel(train_worker.model(args))
    hook = gs.allreduce_hook(compression=args.compression, error_feedback=args.error_feedback)
    model.register_comm_hook(None, hook)
    opt = train_worker.optimizer(args, model.parameters())
    global_batch = args.batch * size
    x, y = train_worker.data(args, args.steps * global_batch)
    for s in range(args.steps):
        rows = slice(s * global_batch + rank * args.batch, s * global_batch + (rank + 1) * args.batch)
        opt.zero_grad()
        F.cross_entropy(model(x[rows]), y[rows]).backward()
        opt.step()
    params = torch.cat([p.detach().reshape(-1) for p in model.module.parameters()])
    torch.save(params, "%s-%d.pt" % (args.save, rank))
    with open("%s-%d.json" % (args.record, rank), "w") as f:
        json.dump({"a": extra["a"].tolist(), "b": extra["b"].tolist(), "traffic": hook.traffic()}, f)
    torch.distributed.destroy_process_group()
    gs.shutdown()


if __name__ == "__main__":
    main()
