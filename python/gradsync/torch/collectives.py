"""Collectives on tensors and objects in every mode, with Horovod's and BytePS's names:
allreduce, allgather, broadcast (and their in-place forms), broadcast_parameters,
broadcast_object, allgather_object, push_pull, and the reduction ops Average, Sum and Adasum.

Every worker must call them in the same order (as Horovod's named collectives, without names).
Each is an all-gather through the scheduler (in pieces of at most 1 MiB a worker) followed by the
same reduction on every worker, in rank order, so that every worker gets the same bits: they are
for metrics, objects and state, not for gradients (gradients go through DistributedOptimizer).
broadcast_ (and broadcast_parameters) use the ring in mode allreduce, for models; call them
before any worker joins.

They go through the scheduler in every mode (mode allreduce included: the ring carries only the
training steps), so a worker that called join() (which leaves the scheduler's membership while
others train) is simply not waited for, and one that ended without join() is named by the
scheduler instead of waited for.
"""

import io
import pickle
import struct

import torch

from gradsync import _job
from gradsync._job import GradsyncError
from gradsync.torch import live
from gradsync.torch.compression import Compression, Compressor


# --- the step header (mode allreduce) ---

TRAINING, JOINED, ENDED = 1, 2, 3
_SPLIT = float(1 << 20)  # a step count travels as two floats, each exact


class StepHeader:
    """What every worker said after a step's gradient: its state (TRAINING, JOINED, ENDED), its
    steps, and which tensors got a gradient on any worker."""

    def __init__(self, values, n, p):
        self.states = [int(round(values[r])) for r in range(n)]
        self.steps = [int(round(values[n + 2 * r] * _SPLIT + values[n + 2 * r + 1])) for r in range(n)]
        self.used = [values[3 * n + i] > 0 for i in range(p)]
        self.active = [r for r in range(n) if self.states[r] == TRAINING]
        self.ended = [r for r in range(n) if self.states[r] == ENDED]


def _workers(ranks):
    return ("worker " if len(ranks) == 1 else "workers ") + ", ".join(str(r) for r in ranks)


def step_header(state, step, counts):
    """Mode allreduce with several workers, after each step's gradient (a worker that joined or
    ended takes part with a zero gradient): one small all-reduce of every worker's state, steps
    and the tensors it gave a gradient. Raises GradsyncError when a worker ended (finish())
    while others still train."""
    job = _job.job()
    n, me, p = job.size, job.rank, len(counts)
    row = torch.zeros(3 * n + p, dtype=torch.float32)
    row[me] = state
    row[n + 2 * me] = step // _SPLIT
    row[n + 2 * me + 1] = step % _SPLIT
    row[3 * n:] = torch.tensor([1.0 if c > 0 else 0.0 for c in counts], dtype=torch.float32)
    job.allreduce(row.numpy(), "sum")
    h = StepHeader([float(v) for v in row], n, p)
    if h.ended and h.active:
        raise GradsyncError(
            "%s ended training (finish()) after %s while %s still training%s: in mode allreduce every step needs "
            "every worker; call gradsync.torch.join() on a worker that runs out of data (or give every worker the "
            "same number of steps)" % (
                _workers(h.ended), ", ".join("%d steps" % h.steps[r] for r in h.ended),
                _workers(h.active) + (" is" if len(h.active) == 1 else " are"),
                " (this worker at step %d)" % step if state == TRAINING else ""))
    return h


class ReduceOp:
    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return self.name


Average = ReduceOp("Average")
Sum = ReduceOp("Sum")
Adasum = ReduceOp("Adasum")


def resolve_op(average=None, op=None):
    """Horovod's rule: op wins; else average (default True) picks Average or Sum."""
    if op is not None:
        if average is not None:
            raise ValueError("allreduce: give op or average, not both")
        if not isinstance(op, ReduceOp):
            raise ValueError("op %r: gradsync.torch.Average, Sum or Adasum" % (op,))
        return op
    return Sum if average is False else Average


# --- tensors as bytes (dtype, shape, values) ---

def _to_bytes(tensor):
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    header = pickle.dumps((str(t.dtype), tuple(t.shape)))
    values = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return struct.pack("<I", len(header)) + header + values


def _from_bytes(data):
    (n,) = struct.unpack_from("<I", data)
    dtype_name, shape = pickle.loads(data[4:4 + n])
    dtype = getattr(torch, dtype_name.replace("torch.", ""))
    raw = bytearray(data[4 + n:])
    flat = torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
    return flat.view(dtype).reshape(shape) if raw else torch.empty(shape, dtype=dtype)


def allgather_bytes(data):
    """Every worker's bytes by rank, through the scheduler (b"" for a worker that has joined)."""
    return _job.job().allgather(data, True)


def _gathered(tensor):
    """Every training worker's tensor, by rank (None for a worker that has joined)."""
    return [_from_bytes(b) if b else None for b in allgather_bytes(_to_bytes(tensor))]


def _adasum_pair(a, b):
    # Adasum (Maleki et al., 2021; Horovod's op=Adasum): each vector is scaled down by its
    # projection onto the other, so orthogonal gradients add and parallel ones average.
    dot = torch.dot(a, b)
    an = torch.dot(a, a)
    bn = torch.dot(b, b)
    ac = 1.0 - dot / (2 * an) if an > 0 else torch.tensor(1.0, dtype=a.dtype)
    bc = 1.0 - dot / (2 * bn) if bn > 0 else torch.tensor(1.0, dtype=a.dtype)
    return ac * a + bc * b


def adasum(tensors):
    """Adasum of the tensors, combined pairwise in a binary tree over ranks (0+1, 2+3, then
    (0+1)+(2+3), ...), in float64; the result has the first tensor's dtype and shape."""
    level = [t.reshape(-1).to(torch.float64) for t in tensors]
    while len(level) > 1:
        nxt = [_adasum_pair(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0].to(tensors[0].dtype).reshape(tensors[0].shape)


def _reduce(tensor, op):
    job = _job.job()
    n = job.size
    if n == 1:
        return tensor.detach().clone()
    parts = [p for p in _gathered(tensor) if p is not None]
    for r, p in enumerate(parts):
        if p.shape != tensor.shape or p.dtype != tensor.dtype:
            raise ValueError("allreduce: worker %d's tensor is %s %s, this worker's %s %s" %
                             (r, p.dtype, list(p.shape), tensor.dtype, list(tensor.shape)))
    if op is Adasum:
        if not tensor.dtype.is_floating_point:
            raise ValueError("allreduce: Adasum needs floating-point tensors (got %s)" % tensor.dtype)
        return adasum(parts)
    wide = torch.float64 if tensor.dtype.is_floating_point else torch.int64
    acc = parts[0].to(wide).clone()
    for p in parts[1:]:
        acc += p.to(wide)
    if op is Average:
        acc = acc / len(parts) if tensor.dtype.is_floating_point else torch.div(acc, len(parts), rounding_mode="floor")
    return acc.to(tensor.dtype)


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None, prescale_factor=1.0,
              postscale_factor=1.0):
    """A new tensor: `op` (Average, the default; Sum; Adasum) of every worker's `tensor`
    (Horovod's allreduce; `name` is accepted and unused: calls match by order). compression:
    the values go through the codec and back (what its wire would deliver), as Horovod's."""
    op = resolve_op(average, op)
    t = tensor.detach()
    if prescale_factor != 1.0:
        t = t * prescale_factor
    ctx = None
    if isinstance(compression, Compressor) and compression.codec == "fp16" and t.dtype.is_floating_point:
        t, ctx = t.to(torch.float16), t.dtype
    out = _reduce(t, op)
    if ctx is not None:
        out = out.to(ctx)
    if postscale_factor != 1.0:
        out = out * postscale_factor
    return out.to(tensor.device)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0):
    """allreduce in place; returns `tensor`."""
    with torch.no_grad():
        tensor.copy_(allreduce(tensor, average, name, Compression.none, op, prescale_factor, postscale_factor))
    return tensor


def push_pull(tensor, average=True, name=None, version=0, priority=0, compression=Compression.none):
    """BytePS's push_pull: the sum (average=True: the average) of every worker's tensor, a new
    tensor (BytePS's push_pull is in place; push_pull_ is too)."""
    return allreduce(tensor, average=average, compression=compression)


def push_pull_(tensor, average=True, name=None, version=0, priority=0):
    return allreduce_(tensor, average=average)


def allgather(tensor, name=None):
    """A new tensor: every worker's `tensor` concatenated along dimension 0 in rank order (the
    first dimension may differ between workers, the others may not)."""
    parts = [p for p in _gathered(tensor) if p is not None]
    for r, p in enumerate(parts):
        if p.dtype != tensor.dtype or tuple(p.shape[1:]) != tuple(tensor.shape[1:]):
            raise ValueError("allgather: worker %d's tensor is %s %s, this worker's %s %s (only dimension 0 may "
                             "differ)" % (r, p.dtype, list(p.shape), tensor.dtype, list(tensor.shape)))
    if tensor.dim() == 0:
        return torch.stack(parts).to(tensor.device)
    return torch.cat(parts).to(tensor.device)


def allgather_object(obj, name=None):
    """Every training worker's picklable `obj`, as a list by rank (None for a worker that has
    joined)."""
    return [pickle.loads(b) if b else None for b in allgather_bytes(pickle.dumps(obj))]


def broadcast(tensor, root_rank, name=None):
    """A new tensor with root_rank's values (every worker passes a tensor of the same shape and
    dtype)."""
    out = tensor.detach().clone()
    broadcast_(out, root_rank)
    return out


def broadcast_(tensor, root_rank, name=None):
    """Overwrites `tensor` with root_rank's, in place; returns it."""
    broadcast_parameters([tensor], root_rank)
    return tensor


def broadcast_parameters(params, root_rank=0):
    """Overwrites every worker's tensors with root_rank's, in place (Horovod's
    broadcast_parameters): `params` is a state_dict, model.named_parameters() or a list of
    tensors. Every worker must pass the same tensors (names, shapes, dtypes) in the same order.
    DistributedOptimizer already starts every worker from worker 0's parameters; this is for the
    rest of the state (buffers), for users of allreduce_hook, and for a checkpoint loaded on
    root_rank after wrapping (Horovod's resume order). PS modes: when the tensors are parameters of
    a DistributedOptimizer, the shards hold the parameters, so root_rank's become the shards' too
    (set at its clock, before any worker's next push; one worker included)."""
    job = _job.job()
    if isinstance(params, dict):
        items = sorted(params.items())
    else:
        items = list(params)
    tensors = [t[1] if isinstance(t, tuple) else t for t in items]
    tensors = [t for t in tensors if isinstance(t, torch.Tensor)]
    for t in tensors:
        if t.device.type != "cpu":
            raise ValueError("broadcast_parameters: CPU tensors only (got one on %s)" % t.device)
    on_shards = _ps_optimizers_holding(tensors)
    for o in on_shards:
        o.synchronize_parameters()  # this step's pulls land first: none may overwrite what is set
    if job.size > 1 and tensors:
        with torch.no_grad():
            parts = [t.detach().contiguous().reshape(-1).view(torch.uint8) for t in tensors]
            flat = torch.cat(parts)
            pad = (-flat.numel()) % 4
            if pad:
                flat = torch.cat([flat, torch.zeros(pad, dtype=torch.uint8)])
            job.broadcast(flat.numpy(), root_rank)
            at = 0
            for t, part in zip(tensors, parts):
                n = part.numel()
                t.copy_(flat[at:at + n].clone().view(t.dtype).view_as(t))  # clone: aligned for the dtype
                at += n
    if on_shards:
        if job.rank == root_rank:
            for o in on_shards:
                o._gs_sync.set_parameters()
        if job.size > 1:
            job.allgather(b"", True)  # no worker pushes before the shards hold root_rank's parameters


def _ps_optimizers_holding(tensors):
    """The live DistributedOptimizers whose shards hold the parameters (PS modes) and whose flat
    parameter buffer one of `tensors` lies in (a parameter, or a state_dict's detached view of one)."""
    opts = [o for o in live.unfinished() if o._gs_strategy.shards_step]
    if not opts or not tensors:
        return []
    held = []
    for o in opts:
        begin = o._gs_flat_params.data_ptr()
        end = begin + o._gs_flat_params.numel() * o._gs_flat_params.element_size()
        if any(t.numel() > 0 and begin <= t.data_ptr() < end for t in tensors):
            held.append(o)
    return held


def broadcast_object(obj, root_rank=0, name=None):
    """root_rank's picklable `obj`, on every worker."""
    job = _job.job()
    if not 0 <= root_rank < job.size:
        raise ValueError("broadcast_object: root_rank %d is not a rank of %d workers" % (root_rank, job.size))
    if job.size == 1:
        return obj
    mine = b""
    if job.rank == root_rank:
        buf = io.BytesIO()
        torch.save(obj, buf)
        mine = buf.getvalue()
    data = allgather_bytes(mine)[root_rank]
    if job.rank == root_rank:
        return obj
    if not data:
        raise GradsyncError("broadcast_object: worker %d, the root, has joined or left" % root_rank)
    return torch.load(io.BytesIO(data))
