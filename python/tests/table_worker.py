"""A worker for the table tests: a small DLRM-style model (a bottom MLP on the click log's dense
features, one table per categorical feature, the dot interaction, a top layer) on the click log
(gradsync._native.ClickLog), trained with gradsync.torch. Worker r of N takes examples
[r*B, (r+1)*B) of each step's global batch of N*B, so N workers with batch B see exactly the batch
one process sees with batch N*B (run it in mode local, with --workers=1 and --batch=N*B).

--tables=bag: gradsync.torch.EmbeddingBag (one id per bag, mode sum); =embedding:
gradsync.torch.Embedding. Rank 0 writes the final dense parameters and the rows of the ids the
run touched (read through the state_dict's ShardedWeight) to --save."""

import argparse
import json
import os
import resource

import torch
import torch.nn.functional as F

import gradsync.torch as gs
from gradsync import _native


def parse(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch", type=int, default=32, help="per worker")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--row-optimizer", default="sgd", choices=["sgd", "adagrad", "adam"])
    p.add_argument("--tables", default="bag", choices=["bag", "embedding", "plain", "plain-bag"],
                   help="gs.EmbeddingBag, gs.Embedding, nn.Embedding(sparse=True), nn.EmbeddingBag(sparse=True)")
    p.add_argument("--reference", action="store_true",
                   help="plain PyTorch, no gradsync (--tables=plain*: torch.optim.SGD on the sparse gradient)")
    p.add_argument("--sparse-as-dense", action="store_true")
    p.add_argument("--features", type=int, default=3)
    p.add_argument("--ids", type=int, default=1000, help="ids per feature (0: any 64-bit id)")
    p.add_argument("--click-ids", type=int, default=0, help="the click log's ids per feature (0: --ids)")
    p.add_argument("--dim", type=int, default=8)
    p.add_argument("--padding", type=int, default=-1, help="padding_idx of every table (-1: none)")
    p.add_argument("--seed", type=int, default=3)
    p.add_argument("--save", default="")
    p.add_argument("--record", default="", help="each rank writes its stats to RECORD-<rank>.json")
    p.add_argument("--dim-rank", type=int, default=-1, help="this rank declares wider rows (bad use)")
    p.add_argument("--bad-id", type=int, default=None, help="step 2's first id becomes this one (bad use)")
    p.add_argument("--max-rows", type=int, default=1 << 24, help="each table's bound, rows per shard")
    p.add_argument("--bag-mode", default="sum", choices=["sum", "mean"], help="the bags' reduction (two ids a bag)")
    p.add_argument("--evaluate", type=int, default=0, help="test examples to score at the end (AUC)")
    return p.parse_args(argv)


class Dlrm(torch.nn.Module):
    def __init__(self, args, dim, table_dim):
        super().__init__()
        torch.manual_seed(args.seed)
        self.bottom = torch.nn.Linear(4, dim)
        padding = None if args.padding < 0 else args.padding
        make = {
            "bag": lambda: gs.EmbeddingBag(args.ids, table_dim, mode=args.bag_mode, optimizer=args.row_optimizer,
                                           padding_idx=padding, max_rows_per_shard=args.max_rows),
            "embedding": lambda: gs.Embedding(args.ids, table_dim, optimizer=args.row_optimizer, padding_idx=padding),
            "plain": lambda: torch.nn.Embedding(args.ids, table_dim, padding_idx=padding, sparse=True),
            "plain-bag": lambda: torch.nn.EmbeddingBag(args.ids, table_dim, mode=args.bag_mode, padding_idx=padding,
                                                       sparse=True),
        }[args.tables]
        self.tables = torch.nn.ModuleList([make() for _ in range(args.features)])
        pairs = (args.features + 1) * args.features // 2
        self.top = torch.nn.Linear(dim + pairs, 1)
        self.bag = args.tables in ("bag", "plain-bag")

    def forward(self, dense, ids):
        x = torch.relu(self.bottom(dense))
        if self.bag:
            # A bag: the feature's id and the next feature's (the last: the first's), so that a
            # mean bag reduces two rows.
            n = ids.shape[1]
            embedded = [t(torch.stack([ids[:, f], ids[:, (f + 1) % n]], dim=1)) for f, t in enumerate(self.tables)]
        else:
            embedded = [t(ids[:, f]) for f, t in enumerate(self.tables)]
        z = torch.stack([x] + embedded, dim=1)  # [B, F+1, dim]
        dots = torch.bmm(z, z.transpose(1, 2))
        i, j = torch.triu_indices(z.shape[1], z.shape[1], offset=1)
        return self.top(torch.cat([x, dots[:, i, j]], dim=1)).squeeze(1)


def reference(args, log, model):
    """Plain PyTorch on the global batch (args.workers * args.batch is the caller's --batch)."""
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    touched = set()
    for step in range(args.steps):
        dense, ids, labels, _ = log.fill(step * args.batch, args.batch)
        dense, ids, labels = torch.from_numpy(dense), torch.from_numpy(ids), torch.from_numpy(labels)
        if args.padding >= 0:
            ids[ids[:, 0] % 7 == 3, 0] = args.padding
        touched.update(ids.reshape(-1).tolist())
        opt.zero_grad()
        F.binary_cross_entropy_with_logits(model(dense, ids), labels).backward()
        opt.step()
    return model, sorted(touched)


def main():
    args = parse()
    if args.reference:
        log = _native.ClickLog(num_dense=4, num_categorical=args.features, ids_per_feature=[args.click_ids or args.ids],
                               zipf_s=1.1, planted_scale=0.5, seed=args.seed)
        model, every = reference(args, log, Dlrm(args, args.dim, args.dim))
        state = model.state_dict()
        torch.save({"dense": {k: v for k, v in state.items() if not k.startswith("tables.")},
                    "rows": {k[:-len(".weight")]: v[every] for k, v in state.items() if k.startswith("tables.")},
                    "ids": every}, args.save)
        return
    gs.init()
    rank, size = gs.rank(), gs.size()
    log = _native.ClickLog(num_dense=4, num_categorical=args.features, ids_per_feature=[args.click_ids or args.ids],
                           zipf_s=1.1, planted_scale=0.5, seed=args.seed)
    model = Dlrm(args, args.dim, args.dim + (1 if rank == args.dim_rank else 0))
    opt = gs.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=args.lr),
                                  named_parameters=model.named_parameters(), sparse_as_dense=args.sparse_as_dense)
    gs.broadcast_parameters(model.state_dict(), root_rank=0)
    touched = set()
    rows_per_step = []
    for step in range(args.steps):
        begin = (step * args.workers + rank) * args.batch
        dense, ids, labels, _ = log.fill(begin, args.batch)
        dense, ids, labels = torch.from_numpy(dense), torch.from_numpy(ids), torch.from_numpy(labels)
        if args.padding >= 0:
            ids[ids[:, 0] % 7 == 3, 0] = args.padding  # some examples' first feature is the padding id
        if args.bad_id is not None and step == 2:
            ids[0, 0] = args.bad_id
        opt.zero_grad()
        loss = F.binary_cross_entropy_with_logits(model(dense, ids), labels)
        loss.backward()
        opt.step(loss=loss)
        rows_per_step.append(opt._gs_table_rows)
        touched.update(ids.reshape(-1).tolist())
    auc = None
    if args.evaluate:
        model.eval()
        with torch.no_grad():
            dense, ids, labels, _ = log.fill(log.test_begin, args.evaluate)
            scores = model(torch.from_numpy(dense), torch.from_numpy(ids))
        auc = _native.auc(scores.numpy(), labels)
    gathered = gs.allgather_object(sorted(touched))
    every = sorted(set(i for ids in gathered for i in ids))
    state = model.state_dict()
    if rank == 0 and args.save:
        rows = {name[:-len(".weight")]: state[name][every] for name in state if name.startswith("tables.")}
        dense_params = {k: v for k, v in state.items() if not k.startswith("tables.")}
        torch.save({"dense": dense_params, "rows": rows, "ids": every}, args.save)
    if args.record:
        json.dump({"rows_per_step": rows_per_step, "sync": opt.sync_kind, "auc": auc,
                   "traffic": list(opt.traffic()), "shm_traffic": list(opt.shm_traffic()),
                   "maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
                   "kinds": [type(v).__name__ for v in state.values()]},
                  open("%s-%d.json" % (args.record, rank), "w"))
    opt.finish()
    gs.shutdown()


if __name__ == "__main__":
    main()
