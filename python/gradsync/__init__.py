"""gradsync: data-parallel training over a parameter server (bsp / ssp / asp) or ring all-reduce,
with optional gradient compression.

    import gradsync as gs
    gs.init()                 # joins the job from GRADSYNC_* (gradsync-launch sets them) or args
    print(gs.rank(), gs.size(), gs.mode())

The PyTorch frontend is gradsync.torch (DistributedOptimizer, broadcast_parameters,
allreduce_hook). Without a job (no GRADSYNC_MODE, no --mode) init() runs mode 'local': one
process, nothing synchronized.
"""

from gradsync._job import (
    GradsyncError,
    config,
    init,
    is_initialized,
    local_rank,
    local_size,
    mode,
    rank,
    shutdown,
    size,
    staleness,
    trace_span,
)

__all__ = [
    "GradsyncError",
    "config",
    "init",
    "is_initialized",
    "local_rank",
    "local_size",
    "mode",
    "rank",
    "shutdown",
    "size",
    "staleness",
    "trace_span",
]
