"""gradsync.torch: PyTorch models over gradsync's parameter server (bsp / ssp / asp) or
all-reduce, with optional compression, with Horovod's calls (a Horovod script runs with
`import gradsync.torch as hvd`; python/README.md lists what differs).

    import gradsync.torch as gs
    gs.init()
    opt = gs.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                                  named_parameters=model.named_parameters(),
                                  compression=gs.Compression.topk(0.01), error_feedback=True)

It also offers everything the gradsync package does (init, rank, size, mode, ...).
"""

import gradsync
from gradsync import *  # noqa: F401,F403 -- the job's calls, under this name too
from gradsync.torch.amp import GradScaler, autocast, precision
from gradsync.torch.collectives import (Adasum, Average, Sum, allgather, allgather_object, allreduce, allreduce_,
                                        broadcast, broadcast_, broadcast_object, push_pull, push_pull_)
from gradsync.torch.compression import Compression, Compressor
from gradsync.torch.embedding import Embedding, EmbeddingBag, ShardedWeight
from gradsync.torch.hook import allreduce_hook, init_process_group
from gradsync.torch.functions import broadcast_optimizer_state, broadcast_parameters, join
from gradsync.torch.optimizer import DistributedOptimizer


def nccl_built():
    """False: the Python frontend synchronizes CPU tensors (gradsync-worker --device=cuda uses NCCL)."""
    return False


def mpi_built():
    return False


def gloo_built():
    return False


def cuda_built():
    return False


__all__ = sorted(gradsync.__all__ + [
    "Adasum", "Average", "Compression", "Compressor", "DistributedOptimizer", "Embedding", "EmbeddingBag",
    "GradScaler", "ShardedWeight", "Sum", "allgather",
    "allgather_object", "allreduce", "allreduce_", "allreduce_hook", "autocast", "broadcast", "broadcast_",
    "broadcast_object", "broadcast_optimizer_state", "broadcast_parameters", "cuda_built", "gloo_built",
    "init_process_group", "join", "mpi_built", "nccl_built", "precision", "push_pull", "push_pull_"])
