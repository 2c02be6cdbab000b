"""For users who keep torch.nn.parallel.DistributedDataParallel: gradsync's ring and codecs as a
DDP communication hook, and a gloo process group set up through the gradsync job.

    gs.init()                                   # mode allreduce (gradsync-launch --mode=allreduce)
    gs.torch.init_process_group()               # gloo, for DDP's own bookkeeping
    ddp = DistributedDataParallel(model)
    ddp.register_comm_hook(None, gs.torch.allreduce_hook(compression="topk:0.01", error_feedback=True))

Each DDP bucket is averaged over gradsync's TCP ring (compressed if asked, with one error-feedback
residual per bucket) on one communication thread, in the order DDP hands the buckets over, which
is the same on every rank; DDP waits for the futures at the end of backward.
"""

import concurrent.futures
import socket

import torch
import torch.distributed as dist

from gradsync import _job, _native


class _AllreduceHook:
    def __init__(self, compression, error_feedback):
        self._reducer = _native.BucketReducer(_job.job(), compression or "", bool(error_feedback))
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="gradsync-hook")
        self._steps = {}

    def traffic(self):
        """(bytes sent, bytes received) over the ring so far."""
        return tuple(self._reducer.traffic())

    def __call__(self, bucket):
        buffer = bucket.buffer()
        index = bucket.index()
        if buffer.dtype != torch.float32 or buffer.device.type != "cpu":
            raise ValueError("allreduce_hook: float32 CPU gradients only (bucket %d is %s on %s)"
                             % (index, buffer.dtype, buffer.device))
        step = self._steps.get(index, 0)
        self._steps[index] = step + 1
        future = torch.futures.Future()
        # A codec that compresses each tensor of the bucket as a matrix (PowerSGD) needs their shapes.
        shapes = [list(g.shape) for g in bucket.gradients()] if self._reducer.needs_shapes else []

        def run():
            try:
                self._reducer.average(buffer.numpy(), index, step, shapes)
                future.set_result(buffer)
            except Exception as e:  # noqa: BLE001 -- handed to DDP through the future
                future.set_exception(e)

        self._executor.submit(run)
        return future


def allreduce_hook(compression=None, error_feedback=False):
    """A DDP communication hook (ddp.register_comm_hook(None, hook)) that averages each gradient
    bucket over gradsync's ring, compressed with `compression` ("fp16", "topk:0.01", ...) if given;
    "powersgd:R" compresses each tensor of a bucket as a matrix at rank R (two all-reduces of its
    factors, warm-started, error feedback with error_feedback=True), as torch's powerSGD_hook does.
    Needs gradsync.init() in mode allreduce. hook.traffic() gives the ring's (bytes sent,
    bytes received)."""
    impl = _AllreduceHook(compression, error_feedback)

    def gradsync_allreduce_hook(state, bucket):
        return impl(bucket)

    gradsync_allreduce_hook.traffic = impl.traffic
    return gradsync_allreduce_hook


def init_process_group(backend="gloo", timeout_s=600):
    """torch.distributed.init_process_group over the gradsync job: worker 0 picks a free port on
    its host and every worker learns it through the scheduler, so that DDP needs no MASTER_ADDR
    or MASTER_PORT. Returns the init method used."""
    job = _job.job()
    host = job.process.get("host", "") or "127.0.0.1"
    mine = b""
    if job.rank == 0:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            mine = ("%s:%d" % (host, s.getsockname()[1])).encode()
    gathered = job.gather("process-group", mine, float(timeout_s))
    address = gathered[0].decode() if gathered and gathered[0] else "%s:%d" % (host, 29500)
    method = "tcp://" + address
    dist.init_process_group(backend, init_method=method, rank=job.rank, world_size=job.size)
    return method
