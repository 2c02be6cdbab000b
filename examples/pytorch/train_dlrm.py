#!/usr/bin/python3
"""A DLRM-style model on the click log, its tables far larger than any process: one
gradsync.torch.EmbeddingBag(2**30, 32) per categorical feature (128 GiB each if dense), whose rows
live on the PS shards (bsp / ssp / asp), in each worker's replica (allreduce) or in this process
(local), a bottom MLP on the dense features, the dot interaction of every pair, and a top MLP.

The click log (gradsync._native.ClickLog, common/data/click/click_log.h) is generated on the fly with
labels from a planted model, so the best achievable AUC and log loss on the test set are known:
worker 0 prints them beside what the model reaches.

  build/bin/gradsync-launch --servers=2 --workers=4 --mode=bsp python3 examples/pytorch/train_dlrm.py
  build/bin/gradsync-launch --servers=2 --workers=4 --mode=asp python3 examples/pytorch/train_dlrm.py --train=800000

Step s of worker r of N reads examples [(s*N + r)*B, (s*N + r + 1)*B): N workers with batch B see
the batches one process sees with batch N*B. Each worker writes <out>/torch-worker-<rank>.json:
its peak resident set, the resident set `import torch` alone took, rows per step, samples/s.
"""

import resource  # noqa: I001 -- the baseline is taken before torch is imported below


def rss_mib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402

TORCH_RSS_MIB = rss_mib("VmRSS")  # what importing torch alone takes in this process

import torch.nn.functional as F  # noqa: E402

import gradsync.torch as gs  # noqa: E402
from gradsync import _native  # noqa: E402


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ids", type=int, default=2**30, help="ids per feature (default 2^30)")
    p.add_argument("--dim", type=int, default=32, help="floats per row (default 32)")
    p.add_argument("--features", type=int, default=26, help="categorical features, one table each (default 26)")
    p.add_argument("--dense", type=int, default=13, help="dense features (default 13)")
    p.add_argument("--zipf", type=float, default=1.5, help="the ids' Zipf exponent (default 1.5)")
    p.add_argument("--planted", type=float, default=0.25, help="the planted effects' spread (default 0.25)")
    p.add_argument("--train", type=int, default=200000, help="training examples per epoch (default 200000)")
    p.add_argument("--test", type=int, default=20000, help="test examples (default 20000)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch", type=int, default=256, help="per worker (default 256)")
    p.add_argument("--lr", type=float, default=0.1, help="dense SGD and the rows' rate (default 0.1)")
    p.add_argument("--table-optimizer", default="adagrad", choices=["sgd", "adagrad", "adam"],
                   help="the rows' optimizer (default adagrad, row-wise)")
    p.add_argument("--hidden", type=int, default=64, help="the MLPs' width (default 64)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    return p.parse_args(argv)


def table_init(args):
    """The rows' initial distribution, as a gs.EmbeddingBag `init` string."""
    return "uniform:%g" % (1.0 / args.ids) ** 0.5 if args.ids else "normal:0.01"


class Dlrm(torch.nn.Module):
    """`table(f)` makes feature f's table (an EmbeddingBag in mode "sum"); by default a
    gs.EmbeddingBag whose rows live where the job's mode puts them."""

    def __init__(self, args, table=None):
        super().__init__()
        if table is None:
            def table(f):
                return gs.EmbeddingBag(args.ids, args.dim, mode="sum", optimizer=args.table_optimizer,
                                       init=table_init(args), name="feature%d" % f)
        self.bottom = torch.nn.Sequential(torch.nn.Linear(args.dense, args.hidden), torch.nn.ReLU(),
                                          torch.nn.Linear(args.hidden, args.dim), torch.nn.ReLU())
        self.tables = torch.nn.ModuleList([table(f) for f in range(args.features)])
        n = args.features + 1
        self.pairs = torch.triu_indices(n, n, offset=1)
        self.top = torch.nn.Sequential(torch.nn.Linear(args.dim + n * (n - 1) // 2, args.hidden), torch.nn.ReLU(),
                                       torch.nn.Linear(args.hidden, 1))

    def forward(self, dense, ids):
        x = self.bottom(dense)
        z = torch.stack([x] + [t(ids[:, f:f + 1]) for f, t in enumerate(self.tables)], dim=1)
        dots = torch.bmm(z, z.transpose(1, 2))[:, self.pairs[0], self.pairs[1]]
        return self.top(torch.cat([x, dots], dim=1)).squeeze(1)


def evaluate(model, log, count, batch=4096):
    model.eval()
    scores, labels = [], []
    with torch.no_grad():
        for at in range(0, count, batch):
            dense, ids, y, _ = log.fill(log.test_begin + at, min(batch, count - at))
            scores.append(model(torch.from_numpy(dense), torch.from_numpy(ids)))
            labels.append(torch.from_numpy(y))
    model.train()
    s, y = torch.cat(scores), torch.cat(labels)
    loss = F.binary_cross_entropy_with_logits(s, y).item()
    return loss, _native.auc(s.numpy(), y.numpy())


def main():
    args = parse()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    gs.init()
    rank, size = gs.rank(), gs.size()
    log = _native.ClickLog(num_dense=args.dense, num_categorical=args.features, ids_per_feature=[args.ids],
                           zipf_s=args.zipf, planted_scale=args.planted, seed=args.seed)
    steps_per_epoch = max(1, args.train // (args.batch * size))
    model = Dlrm(args)
    opt = gs.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=args.lr),
                                  named_parameters=model.named_parameters(), steps_per_epoch=steps_per_epoch,
                                  total_steps=steps_per_epoch * args.epochs)
    gs.broadcast_parameters(model.state_dict(), root_rank=0)  # the tables' ShardedWeights move nothing
    if rank == 0:
        oracle = log.oracle(log.test_begin, args.test)
        print("click log: %d features over %d ids, dim %d; the planted model's AUC %.4f and log loss %.4f on the "
              "%d test examples (the best achievable)" % (args.features, args.ids, args.dim, oracle["auc"],
                                                          oracle["log_loss"], args.test), flush=True)
    rows, step, samples_per_s = [], 0, 0.0
    for epoch in range(args.epochs):
        start, total = time.perf_counter(), 0.0
        for _ in range(steps_per_epoch):
            dense, ids, labels, _ = log.fill((step * size + rank) * args.batch, args.batch)
            opt.zero_grad()
            loss = F.binary_cross_entropy_with_logits(model(torch.from_numpy(dense), torch.from_numpy(ids)),
                                                      torch.from_numpy(labels))
            loss.backward()
            opt.step(loss=loss)
            rows.append(opt.table_rows)
            total += loss.item()
            step += 1
        # This worker's samples over its time, as gradsync-worker's epoch line counts them.
        samples_per_s = steps_per_epoch * args.batch / (time.perf_counter() - start)
        if rank == 0:
            test_loss, auc = evaluate(model, log, args.test)
            print("epoch %d/%d  train_loss %.4f  test_loss %.4f  test_auc %.4f  samples/s %.0f  rows/step %.0f"
                  % (epoch + 1, args.epochs, total / steps_per_epoch, test_loss, auc, samples_per_s,
                     sum(rows[-steps_per_epoch:]) / steps_per_epoch), flush=True)
    out = gs.config()["process"].get("out") or "."
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "torch-worker-%d.json" % rank), "w") as f:
        json.dump({"peak_rss_mib": rss_mib("VmHWM"), "torch_rss_mib": TORCH_RSS_MIB,
                   "maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
                   "rows_per_step": sum(rows) / max(1, len(rows)), "samples_per_s": samples_per_s,
                   "sync": opt.sync_kind}, f)
    opt.finish()
    gs.shutdown()


if __name__ == "__main__":
    main()
