"""gradsync.byteps: BytePS's PyTorch calls over gradsync (a BytePS script runs with
`import gradsync.byteps as bps`): init, rank, size, local_rank, local_size, Compression,
DistributedOptimizer, broadcast_parameters, broadcast_optimizer_state, push_pull, and the rest of
gradsync.torch. The job (mode, servers, workers) comes from gradsync-launch, not from BytePS's
DMLC_* variables. python/README.md lists what differs from BytePS.
"""

from gradsync.torch import *  # noqa: F401,F403
from gradsync.torch import __all__ as _torch_all
from gradsync.torch import push_pull, push_pull_  # noqa: F401


def push_pull_inplace(tensor, average=True, name=None, version=0, priority=0):
    """BytePS's in-place push_pull."""
    return push_pull_(tensor, average=average, name=name)


def declare(name):
    """BytePS declares tensor names ahead of time; gradsync matches collectives by order."""


def suspend():
    raise ValueError("gradsync.byteps: suspend/resume (BytePS's elastic training) is not supported")


resume = suspend

__all__ = sorted(set(_torch_all) | {"declare", "push_pull_inplace"})
