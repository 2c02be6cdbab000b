"""gradsync.torch: PyTorch models over gradsync's parameter server (bsp / ssp / asp) or
all-reduce, with optional compression, following Horovod's and BytePS's conventions.

    import gradsync.torch as gs
    gs.init()
    opt = gs.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                                  named_parameters=model.named_parameters(),
                                  compression="topk:0.01", error_feedback=True)

It also offers everything the gradsync package does (init, rank, size, mode, ...).
"""

import gradsync
from gradsync import *  # noqa: F401,F403 -- the job's calls, under this name too
from gradsync.torch.amp import GradScaler, autocast, precision
from gradsync.torch.hook import allreduce_hook, init_process_group
from gradsync.torch.optimizer import DistributedOptimizer, broadcast_parameters

__all__ = sorted(gradsync.__all__ + ["DistributedOptimizer", "GradScaler", "allreduce_hook", "autocast",
                                     "broadcast_parameters", "init_process_group", "precision"])
