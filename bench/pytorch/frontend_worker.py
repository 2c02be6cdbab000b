"""One process of bench/pytorch/compare.py: the Fashion-MNIST CNN of examples/pytorch on fixed
random batches (no data loading), WARMUP untimed steps, then STEPS timed ones; writes
{samples, seconds} to OUT/bench-<rank>.json.

variants: plain (PyTorch alone, no gradsync), gradsync (gs.DistributedOptimizer in the job's
mode), ddp (DistributedDataParallel, gloo, process group set up through the gradsync job)."""

import argparse
import json
import os
import sys
import time

# One thread per process, BLAS included: torch.set_num_threads sizes PyTorch's own pool, not the
# system OpenBLAS that Debian's torch calls, which otherwise runs every sgemm on a thread per core
# (and, between calls, yields in a loop on the others' cores). Set before torch loads it.
os.environ["OPENBLAS_NUM_THREADS"] = "1"
os.environ["OMP_NUM_THREADS"] = "1"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "pytorch"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from cnn import CNN  # noqa: E402
from torch_train_step import blas_threads  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--variant", choices=["plain", "gradsync", "ddp"], required=True)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    torch.set_num_threads(1)
    if blas_threads() not in (None, 1):
        raise SystemExit("frontend_worker.py: PyTorch's OpenBLAS runs %d threads, not 1" % blas_threads())
    torch.manual_seed(1)
    model = CNN()
    rank = 0
    if args.variant == "plain":
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        gs = None
    else:
        import gradsync.torch as gs
        gs.init()
        rank = gs.rank()
        if args.variant == "ddp":
            gs.init_process_group("gloo")
            model = torch.nn.parallel.DistributedDataParallel(model)
            opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        else:
            opt = gs.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                                          named_parameters=model.named_parameters())
    g = torch.Generator().manual_seed(100 + rank)
    batches = [(torch.randn(args.batch, 1, 28, 28, generator=g), torch.randint(0, 10, (args.batch,), generator=g))
               for _ in range(8)]

    def step(i):
        x, y = batches[i % len(batches)]
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()

    for i in range(args.warmup):
        step(i)
    start = time.perf_counter()
    for i in range(args.steps):
        step(i)
    seconds = time.perf_counter() - start
    if hasattr(opt, "finish"):
        opt.finish(evaluate=False)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench-%d.json" % rank), "w") as f:
        json.dump({"samples": args.steps * args.batch, "seconds": seconds}, f)
    if args.variant == "ddp":
        torch.distributed.destroy_process_group()
    if gs:
        gs.shutdown()


if __name__ == "__main__":
    main()
