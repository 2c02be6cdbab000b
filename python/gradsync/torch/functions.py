"""Horovod's module-level calls that act on the job and the process's optimizers:
broadcast_parameters, broadcast_optimizer_state, join."""

import torch

from gradsync import _job
from gradsync.torch import collectives, live


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
    opts = [o for o in live.unfinished() if o._gs_ps]
    if not opts or not tensors:
        return []
    held = []
    for o in opts:
        begin = o._gs_flat_params.data_ptr()
        end = begin + o._gs_flat_params.numel() * o._gs_flat_params.element_size()
        if any(t.numel() > 0 and begin <= t.data_ptr() < end for t in tensors):
            held.append(o)
    return held


def join(device=-1):
    """Horovod's join(): this worker has no more data. Mode allreduce: it takes part in the other
    workers' steps with a zero gradient (their average is over the workers still training) and
    applies the same updates, until every worker has joined; PS modes: each DistributedOptimizer
    leaves the shards' rounds at once (the others go on without it) and waits at the end for the
    others. Either way the collectives of gradsync.torch go on without it while others train.
    Then each optimizer is finished as by finish(). Returns the rank of the worker that joined
    last (the one that ran the most steps; ties: the highest rank). Every worker must end with
    join() or, when all run the same number of steps, finish()."""
    job = _job.job()
    opts = live.unfinished()
    if job.mode == "allreduce" and job.size > 1 and any(o._gs_rounds for o in opts):
        raise ValueError("join() in mode allreduce with --sync-every is not supported: every rank must take part "
                         "in every round (run the same number of steps and call finish(); the PS modes can join)")
    for o in opts:
        o._gs_joined = True
        o._gs_joined_steps = o._gs_step
    if job.mode == "allreduce" and job.size > 1 and opts:
        job.training_ended(max(o._gs_step for o in opts), True)
        header = None
        while header is None or header.active:
            for o in opts:  # the others step every optimizer, in the order they were built
                header = o._gs_zero_step(collectives.JOINED)
        for o in opts:
            o._gs_end(True, join=True)
        return max(range(job.size), key=lambda r: (header.steps[r], r))
    for o in opts:
        o._gs_end(True, join=True)
    if job.mode == "local" or not opts:
        return job.rank
    # PS modes: past the end's barrier every worker's TRAINING_ENDED has come (the scheduler
    # sends it before the release, on the same connection).
    ended = {rank: clock for rank, clock, _ in job.ended_workers}
    return max(ended, key=lambda r: (ended[r], r)) if ended else job.rank


def broadcast_optimizer_state(optimizer, root_rank=0, model=None):
    """Horovod's broadcast_optimizer_state: every worker's optimizer takes root_rank's settings
    (lr, momentum, ... of every parameter group) and state (momentum buffers, Adam's moments),
    in place. Works on a plain torch optimizer (before DistributedOptimizer wraps it) and on a
    DistributedOptimizer. An empty state stays empty (torch creates it at the first step, alike
    on every worker), so no step is taken. In the PS modes a DistributedOptimizer's state lives
    on the shards, one copy for every worker: only the settings are broadcast."""
    job = _job.job()
    groups = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    groups = collectives.broadcast_object(groups, root_rank)
    if len(groups) != len(optimizer.param_groups):
        raise ValueError("broadcast_optimizer_state: worker %d's optimizer has %d parameter groups, this worker's %d"
                         % (root_rank, len(groups), len(optimizer.param_groups)))
    for g, options in zip(optimizer.param_groups, groups):
        g.update(options)
    if getattr(optimizer, "_gs_ps", False):
        return
    state = collectives.broadcast_object(optimizer.state_dict()["state"], root_rank)
    if job.rank != root_rank:
        optimizer.load_state_dict({"state": state,
                                   "param_groups": [dict(o, params=optimizer.state_dict()["param_groups"][i]["params"])
                                                    for i, o in enumerate(groups)]})
