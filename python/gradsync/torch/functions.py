"""Horovod's module-level calls that act on the job and the process's optimizers:
broadcast_optimizer_state, join (and broadcast_parameters, which collectives.py holds)."""

from gradsync import _job
from gradsync.torch import collectives, live
from gradsync.torch.collectives import broadcast_parameters  # noqa: F401 -- its name here too


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
    if job.mode == "allreduce" and job.size > 1 and any(o._gs_strategy.rounds for o in opts):
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
                header = o._gs_strategy.zero_step(o, collectives.JOINED)
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
    if getattr(getattr(optimizer, "_gs_strategy", None), "shards_step", False):
        return
    state = collectives.broadcast_object(optimizer.state_dict()["state"], root_rank)
    if job.rank != root_rank:
        optimizer.load_state_dict({"state": state,
                                   "param_groups": [dict(o, params=optimizer.state_dict()["param_groups"][i]["params"])
                                                    for i, o in enumerate(groups)]})
