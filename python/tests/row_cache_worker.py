"""A worker for test_row_cache.py: one gs.Embedding table (16 ids x 4 floats, zeros) beside a
small dense layer, trained in ssp. Every step every worker reads rows 0..7 and the loss is their
sum, so each row's gradient is 1 in every element: with SGD at lr 0.5 over 2 workers the shards
move a row by lr * g / 2 = 0.25 per push, and the value a forward read says how many pushes the
row held: n = -4 * value, exactly. Rank 1 sleeps --slow-ms at the start of every step, so rank 0
runs ahead to ssp's bound and rank 1 reads rows that its cache may serve.

Writes RESULT-<rank>.json: per step its clock (the steps finished before it) and the pushes of
each row it read, and the per-step stats (rows pulled, cache hits, read staleness)."""

import argparse
import json
import time

import torch
import torch.nn as nn

import gradsync.torch as gs


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--slow-ms", type=float, default=30)
    p.add_argument("--result", required=True)
    args = p.parse_args()
    gs.init()
    torch.manual_seed(0)
    model = nn.Module()
    model.table = gs.Embedding(16, 4, init="zeros", name="items")
    model.dense = nn.Linear(4, 1)
    opt = gs.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5),
                                  named_parameters=model.named_parameters(), total_steps=args.steps)
    ids = torch.arange(8)
    reads, stats = [], []
    for step in range(args.steps):
        if gs.rank() == 1 and args.slow_ms:
            time.sleep(args.slow_ms / 1e3)
        opt.zero_grad()
        rows = model.table(ids)
        # Every element of every row read: its pushes so far (0.25 each).
        reads.append({"clock": step, "pushes": [round(-4 * v) for v in rows.detach().reshape(-1).tolist()]})
        loss = rows.sum() + (model.dense.weight ** 2).sum()
        loss.backward()
        opt.step(loss=loss)
        stats.append({k: opt.last_stats.get(k) for k in ("rows_pulled", "cache_hits", "read_staleness")})
    opt.finish()
    with open("%s-%d.json" % (args.result, gs.rank()), "w") as f:
        json.dump({"reads": reads, "stats": stats}, f)


if __name__ == "__main__":
    main()
