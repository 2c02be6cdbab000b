"""The sync kinds of DistributedOptimizer, one class each: what a step does with the gradient, who
applies the update, and what the state, the end and the summary are in each.

    Local            mode local: nothing is synchronized; step() is the wrapped optimizer's.
    AllReduce        mode allreduce: the sync averages the gradient buffer (buckets all-reduced on
                     a communication thread while backward goes on), then the wrapped optimizer
                     steps. With several workers each step ends with its step header
                     (collectives.step_header), and a worker that joined or ended takes part in the
                     others' steps with a zero gradient (zero_step).
    AdasumAllReduce  AllReduce with op=Adasum and several workers: no gradient goes through the
                     sync; each worker steps on its own gradient and the updates are combined per
                     tensor with Adasum (Horovod's _DistributedAdasumOptimizer).
    ParameterServer  bsp/ssp/asp: the shards hold the parameters and apply the update with the
                     wrapped optimizer's settings; every parameter is guarded (guard.py) until its
                     pull of the step lands; the optimizer state is the shards' (ps_state.py).
    Rounds           --sync-every=H (local SGD / DiLoCo), over the mode's transport: the wrapped
                     optimizer steps this worker's own model every step; every H steps the
                     pseudo-gradients are exchanged (averaged) and the global model comes back.

choose() picks one, once, when the optimizer is built (and checks op and
gradient_predivide_factor against it); the optimizer (optimizer.py) holds it as _gs_strategy and
asks it wherever the kinds differ. A strategy holds its kind's settings and state; the optimizer
(`opt` below) is passed to each call.
"""

import math
import time

import torch

from gradsync import _native
from gradsync._job import GradsyncError, trace_span
from gradsync.torch import collectives, guard, ps_state
from gradsync.torch.collectives import Adasum, Average, Sum

PS_MODES = ("bsp", "ssp", "asp")


def choose(job, op, gradient_predivide_factor):
    """The strategy of the job's mode for `op` (a resolved collectives.ReduceOp); ValueError for
    what the mode cannot honour."""
    predivide = float(gradient_predivide_factor)
    rounds = int(job.config.get("sync_every", 0))
    if rounds and (op is not Average or predivide != 1.0):
        raise ValueError("--sync-every=%d: op=Average with gradient_predivide_factor 1 only (the workers' "
                         "pseudo-gradients are averaged, not their gradients)" % rounds)
    if not predivide > 0:
        raise ValueError("gradient_predivide_factor must be > 0 (got %r)" % gradient_predivide_factor)
    if predivide != 1.0 and op is not Average:
        raise ValueError("gradient_predivide_factor needs op=Average (got op=%s)" % op)
    if rounds:
        return Rounds(job, op, predivide, rounds)
    if job.mode in PS_MODES:
        if op is Adasum:
            raise ValueError("op=Adasum: mode %s cannot honour it (the shards apply each worker's gradient as it "
                             "arrives, bsp their average); use mode allreduce" % job.mode)
        if predivide != 1.0:
            raise ValueError("gradient_predivide_factor=%g: mode %s cannot honour it (the shards average in "
                             "float32 as they apply, with no sum to keep in range); use 1.0" % (predivide, job.mode))
        return ParameterServer(job, op, predivide)
    if job.mode == "allreduce":
        if op is Adasum and job.size > 1:
            return AdasumAllReduce(job, op, predivide)
        return AllReduce(job, op, predivide)
    return Local(job, op, predivide)


class Local:
    """Mode local, and what every other kind does unless it says otherwise: the sync's own step
    (nothing to exchange here), then the wrapped optimizer's."""

    shards_step = False  # the shards apply the update (the wrapped optimizer does not step here)
    averages_before_step = True  # synchronize() has a gradient to average before step()
    rounds = 0  # --sync-every

    def __init__(self, job, op, predivide):
        self.job = job
        self.op = op
        self.predivide = predivide
        # What a gradient is multiplied by before it leaves (the sync averages).
        self.prescale = 1.0 / predivide
        # The transport is the shards' (the PS modes, with or without rounds): the summary counts
        # their replies, and a worker that joins leaves their rounds.
        self.on_shards = job.mode in PS_MODES

    # --- construction ---

    def optimizer_spec(self, wrapped):
        """What the sync applies: nothing (the wrapped optimizer steps in PyTorch)."""
        return _native.OptimizerSpec()

    def check_compression(self, compression):
        pass

    def check_tables(self, tables):
        """Embedding tables' rows are averaged where they live: op=Average, no predivide."""
        if tables and (self.op is not Average or self.predivide != 1.0):
            raise ValueError("embedding tables ('%s') take op=Average with gradient_predivide_factor 1 (their rows' "
                             "gradients are averaged where the rows live)" % tables[0].table_name)

    def guard(self, opt):
        """The parameters' guards (guard.py); none."""
        return {}

    def ready(self, opt):
        """After construction and after each step, before anything reads a parameter."""

    # --- a step ---

    def begin(self, opt):
        """The step's beginning in the sync (with embedding tables, the rate their rows step at)."""
        lr = float(opt.param_groups[0]["lr"]) if opt._gs_tables else math.nan
        opt._gs_sync.begin_step(opt._gs_step, False, lr)

    def grad_ready(self, opt, i):
        """Parameter i's gradient of the step is complete."""
        opt._gs_sync.grad_ready(i)

    def before_zero_grad(self, opt):
        pass

    def step_before_exchange(self, opt, apply):
        """The step's part before its exchange; returns the wrapped optimizer's result if it steps."""
        return None

    def communicate(self, opt, state):
        """The step's exchange; sets opt._gs_used and returns the stats."""
        stats = self.finish_step(opt, state)
        stats["control_bytes_sent"] = 0
        opt._gs_used = opt._gs_present()
        return stats

    def finish_step(self, opt, state):
        return opt._gs_sync.finish_step()

    def step_after_exchange(self, opt, stats, apply):
        """The wrapped optimizer steps on the exchanged gradient: (its result, its ms)."""
        if not apply:
            return None, 0.0
        t = time.perf_counter()
        with trace_span("optimizer", "compute"):
            result = opt._gs_apply(stats)
        return result, (time.perf_counter() - t) * 1e3

    def apply(self, opt, stats, own_step):
        """The update of the step (opt._gs_apply leaves out the parameters that got no gradient)."""
        return opt._gs_super().step()

    # --- state ---

    def state_dict(self, opt, sd):
        return sd

    def load_state_dict(self, opt, state_dict):
        return opt._gs_super().load_state_dict(state_dict)

    def synchronize_parameters(self, opt):
        pass

    # --- the end ---

    def finish(self, opt):
        """finish(), before training ends in the sync."""

    def end_training(self, opt, evaluate, join):
        if join and self.on_shards:
            opt._gs_sync.end_training(bool(evaluate), join=True)
        else:
            opt._gs_sync.end_training(bool(evaluate))

    def reply_counts(self, opt):
        """The replies' counts for the summary (the shards'), or None."""
        return opt._gs_sync.reply_counts() if self.on_shards else None


class AllReduce(Local):
    """Mode allreduce: the sync averages the gradient, then the wrapped optimizer steps. With
    several workers each step ends with its header (collectives.step_header: who still trains,
    which tensors got a gradient on any worker)."""

    def __init__(self, job, op, predivide):
        super().__init__(job, op, predivide)
        self.ring = job.size > 1  # each step ends with its header
        self.header = None  # the last step's
        self.active = job.size  # the workers still training, by the last header

    def communicate(self, opt, state):
        stats = self.finish_step(opt, state)
        stats["control_bytes_sent"] = 0
        if self.ring:
            # The step's header, its bytes apart from the gradient's.
            t = time.perf_counter()
            before = self.bytes_sent(opt, stats)
            steps = opt._gs_step if state != collectives.JOINED else opt._gs_joined_steps
            self.header = collectives.step_header(
                state, steps, opt._gs_present() if state == collectives.TRAINING else opt._gs_counts)
            self.active = len(self.header.active)
            opt._gs_used = self.header.used
            stats["comm_ms"] += (time.perf_counter() - t) * 1e3
            opt._gs_count_traffic(stats)
            stats["control_bytes_sent"] = stats["bytes_sent"] - before
        else:
            opt._gs_used = opt._gs_present()
        self.rescale(opt)
        return stats

    def bytes_sent(self, opt, stats):
        return stats["bytes_sent"]

    def rescale(self, opt):
        # The exchanged gradient is the average of what left: undo the predivide factor, make
        # op=Sum's sum of it.
        if self.predivide != 1.0:
            opt._gs_flat_grads.mul_(self.predivide)
        if self.op is Sum:
            opt._gs_flat_grads.mul_(float(self.job.size))
        elif self.active < self.job.size:
            # Workers that joined contributed zeros: the average is over those still training
            # (as the shards' rounds are in the PS modes).
            opt._gs_flat_grads.mul_(float(self.job.size) / max(1, self.active))

    def finish(self, opt):
        if self.ring:
            # One step with a zero gradient and the state "ended": the same as the others' last
            # one when every worker ends here; the others' next one (they fail, naming this
            # worker, and so does this worker) when they still train.
            opt._gs_job.training_ended(opt._gs_step, False)
            trained = opt._gs_step
            self.zero_step(opt, collectives.ENDED)
            opt._gs_step = trained  # the end's step trains nothing: steps (and the summary's) stay these

    def zero_step(self, opt, state):
        """A step with a zero gradient through the same collectives as a training step (a worker
        that joined, or the end of training), then the same update, so that this replica stays
        the others'. Returns the step header."""
        if opt._gs_finished:
            raise GradsyncError("a training step of an optimizer that finish() ended on this worker")
        opt._gs_begin()
        opt._gs_flat_grads.zero_()
        opt._gs_counts = [0] * len(opt._gs_params)
        for i in reversed(range(len(opt._gs_params))):
            self.grad_ready(opt, i)
        stats = opt._gs_communicate(state)
        if self.header.active:
            opt._gs_apply(stats, own_step=False)
        opt._gs_end_step()
        return self.header


class AdasumAllReduce(AllReduce):
    """op=Adasum in mode allreduce with several workers: no averaging in the sync; each worker
    steps on its own gradient, and the updates are combined per tensor with Adasum."""

    def check_compression(self, compression):
        if compression not in (None, "", "none"):
            raise ValueError("op=Adasum with compression %r: Adasum combines the workers' exact updates" % compression)

    def check_tables(self, tables):
        if tables:
            raise ValueError("op=Adasum with embedding tables ('%s'): their rows are averaged where they live"
                             % tables[0].table_name)

    def begin(self, opt):
        pass

    def grad_ready(self, opt, i):
        pass

    def finish_step(self, opt, state):
        return dict(comm_ms=0.0, wait_ms=0.0, hidden_ms=0.0, blocked_ms=0.0, version_lag=math.nan,
                    clock_staleness=math.nan, loss_scale=math.nan, skipped_steps=0)

    def bytes_sent(self, opt, stats):
        return opt._gs_sync.traffic()[0]

    def rescale(self, opt):
        pass

    def apply(self, opt, stats, own_step):
        # Horovod's _DistributedAdasumOptimizer: the wrapped optimizer steps on this worker's own
        # gradient, and every tensor's update becomes the Adasum of the workers' updates.
        before = opt._gs_flat_params.clone()
        result = opt._gs_super().step() if own_step else None  # joined: a zero update
        t = time.perf_counter()
        delta = opt._gs_flat_params - before
        gathered = [torch.frombuffer(bytearray(b), dtype=torch.float32)
                    for b in opt._gs_job.allgather(delta.numpy().tobytes())]
        with torch.no_grad():
            for p, offset in zip(opt._gs_params, opt._gs_sync.offsets):
                n = p.numel()
                combined = collectives.adasum([g[offset:offset + n] for g in gathered])
                opt._gs_flat_params[offset:offset + n] = before[offset:offset + n] + combined
        stats["comm_ms"] += (time.perf_counter() - t) * 1e3
        opt._gs_count_traffic(stats)
        return result


class ParameterServer(Local):
    """Modes bsp, ssp, asp: the shards apply the update, with the wrapped optimizer's settings at
    the learning rate the optimizer has when the step begins (so a torch LR scheduler drives it);
    step() pushes what is left and does not run the wrapped optimizer."""

    shards_step = True

    def __init__(self, job, op, predivide):
        super().__init__(job, op, predivide)
        self.optimizer_kind = ""  # "sgd" or "adam": the shards' state (ps_state.py)
        if op is Sum:
            self.prescale = float(job.size)  # the shards' average of N times the gradients is their sum

    def optimizer_spec(self, wrapped):
        spec = _ps_optimizer_spec(wrapped, self.job.mode)
        self.optimizer_kind = spec.kind
        return spec

    def guard(self, opt):
        # Every parameter guarded: its first read in a step waits for its pull (opt._gs_land).
        return guard.guard(opt._gs_params, opt)

    def begin(self, opt):
        opt._gs_sync.begin_step(opt._gs_step, False, float(opt.param_groups[0]["lr"]))

    def before_zero_grad(self, opt):
        # The step begins first: its pulls go out, and the previous push has left the gradient
        # buffer before it is overwritten.
        if not opt._gs_begun and not opt._gs_finished:
            opt._gs_begin()

    def finish_step(self, opt, state):
        if state == collectives.TRAINING:
            # A parameter whose .grad torch would have as None: the shards leave it and its
            # optimizer state alone, as torch's optimizer would.
            for i, present in enumerate(opt._gs_present()):
                if not present:
                    opt._gs_sync.grad_absent(i)
        return opt._gs_sync.finish_step()

    def step_after_exchange(self, opt, stats, apply):
        return None, 0.0

    def state_dict(self, opt, sd):
        sd["state"] = ps_state.to_torch(opt._gs_sync.optimizer_state(), opt._gs_params, self.optimizer_kind,
                                        ps_state.param_index(opt.param_groups))
        return sd

    def load_state_dict(self, opt, state_dict):
        opt._gs_super().load_state_dict({"state": {}, "param_groups": state_dict["param_groups"]})
        opt._gs_sync.set_optimizer_state(ps_state.from_torch(
            state_dict["state"], opt._gs_params, self.optimizer_kind,
            ps_state.param_index(opt.param_groups)))

    def synchronize_parameters(self, opt):
        if opt._gs_finished:
            return
        if not opt._gs_begun:
            opt._gs_begin()
        for i in range(len(opt._gs_params)):
            opt._gs_land(i)


class Rounds(Local):
    """--sync-every=H (local SGD / DiLoCo): the wrapped optimizer steps this worker's own model
    every step, before the step's exchange; every H steps the pseudo-gradients go through the
    mode's sync (PS: the shards; all-reduce: every rank), which applies the outer SGD."""

    averages_before_step = False  # the gradient stays this worker's

    def __init__(self, job, op, predivide, rounds):
        super().__init__(job, op, predivide)
        self.rounds = rounds

    def ready(self, opt):
        # A round's first step begins before anything reads a parameter: it puts the global model
        # (PS: this round's pull) into the parameters.
        if opt._gs_step % self.rounds == 0 and (not opt._gs_total or opt._gs_step < opt._gs_total):
            opt._gs_begin()

    def step_before_exchange(self, opt, apply):
        # The wrapped optimizer steps this worker's own model first (its time counts in
        # compute_ms); the step's exchange (the pseudo-gradient, when it ends a round) follows.
        opt._gs_used = opt._gs_present()
        if not apply:
            return None
        with trace_span("optimizer", "compute"):
            return opt._gs_apply(None)

    def step_after_exchange(self, opt, stats, apply):
        return None, 0.0


def _ps_optimizer_spec(optimizer, mode):
    """The wrapped optimizer as the shards apply it; ValueError for what they cannot."""
    groups = optimizer.param_groups
    first = groups[0]
    for g in groups[1:]:
        for k, v in first.items():
            if k != "params" and g.get(k) != v:
                raise ValueError("mode %s: the shards apply one setting to every parameter; the parameter groups "
                                 "differ in '%s' (%r and %r)" % (mode, k, v, g.get(k)))
    spec = _native.OptimizerSpec()
    spec.lr = float(first["lr"])
    spec.weight_decay = float(first.get("weight_decay", 0.0))
    name = type(optimizer).__name__
    if isinstance(optimizer, torch.optim.SGD):
        if first.get("dampening", 0):
            raise ValueError("mode %s: SGD with dampening is not supported by the shards" % mode)
        if first.get("maximize", False):
            raise ValueError("mode %s: SGD with maximize=True is not supported by the shards" % mode)
        spec.kind = "sgd"
        spec.momentum = float(first.get("momentum", 0.0))
        spec.nesterov = bool(first.get("nesterov", False))
    elif isinstance(optimizer, torch.optim.Adam):
        if first.get("amsgrad", False):
            raise ValueError("mode %s: Adam with amsgrad=True is not supported by the shards" % mode)
        if first.get("maximize", False):
            raise ValueError("mode %s: Adam with maximize=True is not supported by the shards" % mode)
        spec.kind = "adam"
        spec.beta1, spec.beta2 = (float(b) for b in first["betas"])
        spec.eps = float(first["eps"])
    else:
        raise ValueError("mode %s: the parameter servers apply the update, with SGD (momentum, Nesterov, weight "
                         "decay) or Adam; %s is not supported (use mode allreduce for any optimizer)" % (mode, name))
    return spec
