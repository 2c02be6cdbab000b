"""gradsync.torch: PyTorch models over gradsync's parameter server (bsp / ssp / asp) or
all-reduce, with optional compression, following Horovod's and BytePS's conventions.

    import gradsync.torch as gs
    gs.init()
    opt = gs.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                                  named_parameters=model.named_parameters(),
                                  compression="topk:0.01", error_feedback=True)
"""

from gradsync._job import (
    GradsyncError,
    config,
    init,
    is_initialized,
    mode,
    rank,
    shutdown,
    size,
    staleness,
)
from gradsync.torch.hook import allreduce_hook, init_process_group
from gradsync.torch.optimizer import DistributedOptimizer, broadcast_parameters

__all__ = [
    "DistributedOptimizer",
    "GradsyncError",
    "allreduce_hook",
    "broadcast_parameters",
    "config",
    "init",
    "init_process_group",
    "is_initialized",
    "mode",
    "rank",
    "shutdown",
    "size",
    "staleness",
]
