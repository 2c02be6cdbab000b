"""One process of bench/pytorch/dlrm_compare.py: examples/pytorch/train_dlrm.py's DLRM-style model
(its Dlrm class, the same bottom and top MLPs and dot interaction) on the click log, batches made
before the clock starts, WARMUP untimed steps, then STEPS timed ones; plain SGD on everything (the
rows included, at the same rate). Writes {samples, seconds, peak_rss_mib, auc} to
OUT/bench-<rank>.json, or {error} when the model could not be built.

variants: plain (PyTorch alone, nn.EmbeddingBag(sparse=True), no communication), ddp
(DistributedDataParallel over gloo with nn.EmbeddingBag(sparse=True), as a PyTorch user writes it:
the process group set up through the gradsync job), gradsync (gs.EmbeddingBag and
gs.DistributedOptimizer in the job's mode: the rows on the shards in bsp, all-gathered in
allreduce).

The plain and ddp variants cap their address space at the machine's memory (RLIMIT_AS), so a table
that does not fit is refused by PyTorch's allocator at once instead of swapping the machine."""

import argparse
import json
import os
import resource
import sys
import time

# One thread per process, BLAS included (as frontend_worker.py): set before torch loads it.
os.environ["OPENBLAS_NUM_THREADS"] = "1"
os.environ["OMP_NUM_THREADS"] = "1"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples", "pytorch"))
import train_dlrm  # noqa: E402
from gradsync import _native  # noqa: E402  (the click log: the data, not the sync)


def cap_address_space():
    with open("/proc/meminfo") as f:
        total = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemTotal:"))
    resource.setrlimit(resource.RLIMIT_AS, (total, total))


def torch_table(args):
    """nn.EmbeddingBag(sparse=True) tables drawn from train_dlrm's distribution with a generator of
    their own, so that the MLPs start from the same weights as gs.EmbeddingBag's model (whose rows
    take nothing from torch's generator)."""
    g = torch.Generator().manual_seed(args.seed + 1)
    kind, scale = train_dlrm.table_init(args).split(":")

    def make(f):
        with torch.random.fork_rng():  # the constructor's own draw leaves torch's generator as it was
            t = torch.nn.EmbeddingBag(args.ids, args.dim, mode="sum", sparse=True)
        with torch.no_grad():
            if kind == "uniform":
                t.weight.uniform_(-float(scale), float(scale), generator=g)
            else:
                t.weight.normal_(0.0, float(scale), generator=g)
        return t
    return make


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--variant", choices=["plain", "gradsync", "ddp"], required=True)
    p.add_argument("--ids", type=int, default=100000, help="ids per feature (default 10^5)")
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--test", type=int, default=5000, help="test examples rank 0 scores after the steps")
    p.add_argument("--rank", type=int, default=0, help="plain: which worker's batches")
    p.add_argument("--size", type=int, default=1, help="plain: how many workers split the log")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    args = train_dlrm.parse(["--ids=%d" % a.ids, "--dim=%d" % a.dim, "--batch=%d" % a.batch,
                             "--table-optimizer=sgd"])
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    rank, size, gs = a.rank, a.size, None
    if a.variant != "plain":
        import gradsync.torch as gs
        gs.init()
        rank, size = gs.rank(), gs.size()
    os.makedirs(a.out, exist_ok=True)
    result = os.path.join(a.out, "bench-%d.json" % rank)
    try:
        if a.variant == "gradsync":
            model = train_dlrm.Dlrm(args)
        else:
            cap_address_space()
            model = train_dlrm.Dlrm(args, table=torch_table(args))
    except (RuntimeError, MemoryError) as e:
        with open(result, "w") as f:
            json.dump({"error": str(e).splitlines()[0]}, f)
        print("worker %d: %s" % (rank, str(e).splitlines()[0]), file=sys.stderr)
        sys.exit(3)
    net = model
    if a.variant == "ddp":
        gs.init_process_group("gloo")
        net = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(net.parameters(), lr=args.lr)
    if a.variant == "gradsync":
        opt = gs.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        gs.broadcast_parameters(model.state_dict(), root_rank=0)
    log = _native.ClickLog(num_dense=args.dense, num_categorical=args.features, ids_per_feature=[args.ids],
                           zipf_s=args.zipf, planted_scale=args.planted, seed=args.seed)
    batches = []
    for step in range(a.warmup + a.steps):
        dense, ids, labels, _ = log.fill((step * size + rank) * args.batch, args.batch)
        batches.append((torch.from_numpy(dense), torch.from_numpy(ids), torch.from_numpy(labels)))

    def step(b):
        dense, ids, labels = b
        opt.zero_grad()
        loss = F.binary_cross_entropy_with_logits(net(dense, ids), labels)
        loss.backward()
        opt.step()

    for b in batches[:a.warmup]:
        step(b)
    start = time.perf_counter()
    for b in batches[a.warmup:]:
        step(b)
    seconds = time.perf_counter() - start
    auc = None
    if rank == 0 and a.test:
        _, auc = train_dlrm.evaluate(model, log, a.test)
    if a.variant == "gradsync":
        opt.finish(evaluate=False)
    with open(result, "w") as f:
        json.dump({"samples": a.steps * args.batch, "seconds": seconds,
                   "peak_rss_mib": train_dlrm.rss_mib("VmHWM"), "auc": auc}, f)
    if a.variant == "ddp":
        torch.distributed.destroy_process_group()
    if gs is not None:
        gs.shutdown()


if __name__ == "__main__":
    main()
