"""A training script in Horovod's style (`import gradsync.torch as hvd`, BytePS's with --byteps),
for test_horovod_api.py: every call the Horovod and BytePS example scripts make, on a small CNN
and seeded synthetic images. Rank r writes RESULT-<r>.json with what it saw.

    hvd.init(); rank / size / local_rank / local_size
    broadcast_parameters(model.state_dict()), broadcast_optimizer_state (before and after wrapping)
    DistributedOptimizer(opt, named_parameters, compression=Compression.fp16|none, op=Average|Sum|Adasum,
                         gradient_predivide_factor=F, backward_passes_per_step=K)
    optimizer.synchronize() + with optimizer.skip_synchronize(): optimizer.step()
    hvd.allreduce(tensor, name=...) for the metrics, allgather, broadcast, broadcast_object, join
"""

import argparse
import json

import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, kernel_size=3)
        self.conv2 = nn.Conv2d(4, 8, kernel_size=3)
        self.fc1 = nn.Linear(8 * 2 * 2, 16)
        self.fc2 = nn.Linear(16, 10)
        self.unused = nn.Linear(3, 3)  # never called: gets no gradient, so no update (as in torch)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2).flatten(1)
        return self.fc2(F.relu(self.fc1(x)))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--result", required=True)
    p.add_argument("--byteps", action="store_true", help="import gradsync.byteps as bps and use push_pull")
    p.add_argument("--fp16-allreduce", action="store_true")
    p.add_argument("--op", default="Average", choices=["Average", "Sum", "Adasum"])
    p.add_argument("--predivide", type=float, default=1.0)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--uneven", type=int, default=0, help="the last rank runs this many steps fewer")
    p.add_argument("--join", action="store_true", help="end with hvd.join() instead of finish()")
    p.add_argument("--passes", type=int, default=1, help="backward_passes_per_step")
    args = p.parse_args()

    if args.byteps:
        import gradsync.byteps as hvd
    else:
        import gradsync.torch as hvd
    hvd.init()
    torch.manual_seed(42 + hvd.rank())  # different on every rank: broadcast_parameters must fix it
    model = Net()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05 * (1 + hvd.rank()), momentum=0.5, weight_decay=1e-3)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)  # before wrapping (Horovod's MNIST script)
    lr_after_broadcast = optimizer.param_groups[0]["lr"]
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    unused_before = model.unused.weight.detach().clone()
    params0 = [float(v) for v in torch.cat([q.detach().reshape(-1) for q in model.parameters()])]
    if args.byteps:
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                             compression=compression, backward_passes_per_step=args.passes)
    else:
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                             compression=compression, op=getattr(hvd, args.op),
                                             gradient_predivide_factor=args.predivide,
                                             backward_passes_per_step=args.passes)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)  # after wrapping (the benchmarks')

    g = torch.Generator().manual_seed(7 + hvd.rank())
    steps = args.steps - (args.uneven if hvd.rank() == hvd.size() - 1 else 0)
    losses = []
    for step in range(steps):
        optimizer.zero_grad()
        for _ in range(args.passes):
            x = torch.randn(8, 1, 14, 14, generator=g)
            y = torch.randint(0, 10, (8,), generator=g)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
        if step % 2 and hvd.mode() == "allreduce" and args.op != "Adasum":
            optimizer.synchronize()  # Horovod's gradient clipping / AMP pattern
            torch.nn.utils.clip_grad_norm_(model.parameters(), 100.0)
            with optimizer.skip_synchronize():
                optimizer.step()
        else:
            optimizer.step()
        # Metric averaging, as the example scripts do it.
        if args.byteps:
            avg = hvd.push_pull(torch.tensor(float(loss)), name="avg_loss")
        else:
            avg = hvd.allreduce(torch.tensor(float(loss)), name="avg_loss")
        losses.append(float(avg))
    if args.join:
        last = hvd.join()
    else:
        optimizer.finish()
        last = None

    result = dict(rank=hvd.rank(), size=hvd.size(), local_rank=hvd.local_rank(), local_size=hvd.local_size(),
                  mode=hvd.mode(), steps=steps, last_joined=last, lr_after_broadcast=lr_after_broadcast,
                  avg_losses=losses, kind=optimizer.sync_kind,
                  unused_moved=not torch.equal(unused_before, model.unused.weight.detach()),
                  params0=params0, params=[float(v) for v in torch.cat([q.detach().reshape(-1) for q in model.parameters()])])
    # The other collectives, in every mode.
    result["allreduce_sum"] = float(hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum))
    result["allreduce_int"] = hvd.allreduce(torch.tensor([hvd.rank() * 3], dtype=torch.int64), average=False).tolist()
    result["allreduce_2d"] = hvd.allreduce(torch.full((2, 3), float(hvd.rank()))).tolist()
    result["allgather"] = hvd.allgather(torch.full((hvd.rank() + 1, 2), float(hvd.rank()))).tolist()
    result["broadcast"] = hvd.broadcast(torch.tensor([float(hvd.rank())] * 3), root_rank=hvd.size() - 1).tolist()
    inplace = torch.tensor([float(hvd.rank())])
    hvd.broadcast_(inplace, root_rank=0)
    result["broadcast_"] = inplace.tolist()
    result["broadcast_object"] = hvd.broadcast_object({"from": hvd.rank(), "text": "x" * (1 + hvd.rank())}, root_rank=1)
    result["allgather_object"] = hvd.allgather_object(("rank", hvd.rank()))
    with open("%s-%d.json" % (args.result, hvd.rank()), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
