"""DistributedOptimizer: any PyTorch model trains over gradsync's parameter server or all-reduce.

    opt = gs.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                                        named_parameters=model.named_parameters())
    for x, y in loader:
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step(loss=loss)      # loss: optional, for the metrics rows
    opt.finish()

No copy between PyTorch and the transport: at construction every parameter's storage becomes a
view of the sync's flat parameter buffer and its .grad a view of the flat gradient buffer (one
copy, of the initial values). The PS client sends straight from the gradient buffer and writes
pulled values straight into the parameter buffer; the ring averages the gradient buffer in place.

Per mode:
  allreduce  backward's per-parameter hooks hand each gradient to the sync (buckets all-reduced on
             a communication thread while backward goes on; compressed if asked); step() waits
             for the average, then the wrapped optimizer steps, whatever it is.
  bsp/ssp/asp  the shards hold the parameters and apply the update with the wrapped optimizer's
             settings (SGD with momentum / Nesterov / weight decay, or Adam), at the learning rate
             the optimizer has when the step begins (so a torch LR scheduler drives it). Each
             parameter's gradient is pushed as soon as backward produced it; the next step's pulls
             go out in forward order when the step begins (at zero_grad() or the first forward,
             whichever comes first; the previous push has then left the gradient buffer). Every
             parameter is guarded (guard.py): the first torch operation that reads it in a
             step waits for its pull, whoever reads it (its module, a parent's forward, a fast path,
             functional code, code outside forward). step() sends what is left and does not run
             the wrapped optimizer.
  local      nothing is synchronized; step() is the wrapped optimizer's.
"""

import contextlib
import hashlib
import inspect
import math
import time

import torch

from gradsync import _job, _native
from gradsync._job import GradsyncError, trace_span
from gradsync.torch import collectives, guard, live, ps_state
from gradsync.torch.collectives import Adasum, Average, Sum
from gradsync.torch.compression import codec_of
from gradsync.torch.metrics import Recorder

_PS_MODES = ("bsp", "ssp", "asp")
# What torch's own Optimizer.zero_grad() does by default (False before torch 2.0, True since).
_SET_TO_NONE_DEFAULT = inspect.signature(torch.optim.Optimizer.zero_grad).parameters["set_to_none"].default


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


class _DistributedOptimizer(torch.optim.Optimizer):
    # The methods of this class are copied into a subclass of the wrapped optimizer's class
    # (DistributedOptimizer below), so `self` is an SGD, an Adam, ... and LR schedulers accept it.

    def __init__(self, params, named_parameters, compression, error_feedback, backward_passes_per_step,
                 steps_per_epoch, total_steps, wrapped, op, gradient_predivide_factor):
        super(self.__class__, self).__init__(params)
        job = _job.job()
        self._gs_job = job
        self._gs_mode = job.mode
        op = collectives.resolve_op(None, op)
        predivide = float(gradient_predivide_factor)
        # Local SGD / DiLoCo (--sync-every=H): the wrapped optimizer steps this worker's own model
        # every step; every H steps the pseudo-gradients are exchanged in the mode's way.
        self._gs_rounds = int(job.config.get("sync_every", 0))
        if self._gs_rounds and (op is not Average or predivide != 1.0):
            raise ValueError("--sync-every=%d: op=Average with gradient_predivide_factor 1 only (the workers' "
                             "pseudo-gradients are averaged, not their gradients)" % self._gs_rounds)
        if not predivide > 0:
            raise ValueError("gradient_predivide_factor must be > 0 (got %r)" % gradient_predivide_factor)
        if predivide != 1.0 and op is not Average:
            raise ValueError("gradient_predivide_factor needs op=Average (got op=%s)" % op)
        if self._gs_mode in _PS_MODES and not self._gs_rounds:
            if op is Adasum:
                raise ValueError("op=Adasum: mode %s cannot honour it (the shards apply each worker's gradient as it "
                                 "arrives, bsp their average); use mode allreduce" % self._gs_mode)
            if predivide != 1.0:
                raise ValueError("gradient_predivide_factor=%g: mode %s cannot honour it (the shards average in "
                                 "float32 as they apply, with no sum to keep in range); use 1.0" % (predivide, self._gs_mode))
        self._gs_op = op
        self._gs_predivide = predivide
        # op=Adasum: no averaging in the sync; step() combines the workers' updates (below).
        self._gs_adasum = op is Adasum and self._gs_mode == "allreduce" and job.size > 1
        # What a gradient is multiplied by before it leaves (the sync averages): op=Sum in the PS
        # modes (the shards' average of N times the gradients is their sum), the predivide factor.
        self._gs_prescale = 1.0 / predivide
        if op is Sum and self._gs_mode in _PS_MODES:
            self._gs_prescale = float(job.size)
        compression = codec_of(compression)
        in_groups = [p for g in self.param_groups for p in g["params"]]
        if named_parameters is None:
            named = [("param.%d" % i, p) for i, p in enumerate(in_groups)]
        else:
            named = list(named_parameters)
        names = set()
        for name, p in named:
            if name in names:
                raise ValueError("named_parameters: '%s' appears twice" % name)
            names.add(name)
        grouped = {id(p) for p in in_groups}
        for name, p in named:
            if id(p) not in grouped:
                raise ValueError("parameter '%s' is not in the optimizer's parameter groups" % name)
        named_ids = {id(p) for _, p in named}
        for p in in_groups:
            if id(p) not in named_ids:
                raise ValueError("a parameter of the optimizer (shape %s) is missing from named_parameters"
                                 % list(p.shape))
        named = [(n, p) for n, p in named if p.requires_grad]
        for name, p in named:
            if p.dtype != torch.float32 or p.device.type != "cpu":
                raise ValueError("parameter '%s' is %s on %s: the frontend synchronizes float32 CPU tensors"
                                 % (name, p.dtype, p.device))
        if backward_passes_per_step < 1:
            raise ValueError("backward_passes_per_step must be >= 1")
        # The shards apply the wrapped optimizer in the PS modes (with rounds they apply the outer SGD).
        shards_step = self._gs_mode in _PS_MODES and not self._gs_rounds
        spec = _ps_optimizer_spec(wrapped, self._gs_mode) if shards_step else _native.OptimizerSpec()
        self._gs_kind = spec.kind
        feedback = -1 if error_feedback is None else int(bool(error_feedback))
        if self._gs_adasum and compression not in (None, "", "none"):
            raise ValueError("op=Adasum with compression %r: Adasum combines the workers' exact updates" % compression)
        self._gs_sync = _native.Sync(job, [(n, list(p.shape)) for n, p in named], spec, compression or "", feedback)
        self._gs_names = [n for n, _ in named]
        self._gs_params = [p for _, p in named]
        self._gs_index = {id(p): i for i, p in enumerate(self._gs_params)}
        self._gs_passes = backward_passes_per_step
        # The flat buffers, as tensors sharing their memory, and every parameter rebound to them.
        self._gs_flat_params = torch.from_numpy(self._gs_sync.params)
        self._gs_flat_grads = torch.from_numpy(self._gs_sync.grads)
        self._gs_param_views = []
        self._gs_grad_views = []
        with torch.no_grad():
            for p, offset in zip(self._gs_params, self._gs_sync.offsets):
                n = p.numel()
                pv = self._gs_flat_params[offset:offset + n].view_as(p)
                pv.copy_(p.data)
                p.data = pv
                gv = self._gs_flat_grads[offset:offset + n].view_as(p)
                gv.zero_()
                p.grad = gv
                self._gs_param_views.append(pv)
                self._gs_grad_views.append(gv)
        self._gs_grad_ptrs = [g.data_ptr() for g in self._gs_grad_views]
        self._gs_counts = [0] * len(self._gs_params)
        # Per parameter: torch's .grad would be None now (no gradient yet, or none since a
        # zero_grad(set_to_none=True)); with no gradient this step, torch's optimizer skips it.
        self._gs_none = [True] * len(self._gs_params)
        self._gs_waited = [False] * len(self._gs_params)
        self._gs_begun = False
        self._gs_finished = False
        self._gs_ps = shards_step
        self.last_stats = {}
        self._gs_total = int(total_steps or 0)
        self._gs_delay_ms = None  # this step's injected delay, once slept
        self._gs_step = self._gs_sync.start(self._gs_total, int(steps_per_epoch or 1))
        self._gs_recorder = Recorder(job, int(self._gs_flat_params.numel()), steps_per_epoch)
        self._gs_hooks = []
        self._gs_accumulators = []
        for i, p in enumerate(self._gs_params):
            accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
            self._gs_hooks.append(accumulator.register_hook(self._gs_make_hook(i)))
            self._gs_accumulators.append(accumulator)
        self._gs_guarded = {}
        if self._gs_ps:
            # Every parameter guarded (above): its first read in a step waits for its pull.
            self._gs_guarded = guard.guard(self._gs_params, self)
        self._gs_last_end = time.perf_counter()
        self._gs_synced = None  # the stats of a synchronize() the coming step() finishes
        self._gs_skip_sync = False  # inside skip_synchronize()
        self._gs_failure = None  # a GradsyncError a gradient hook met, raised by step()
        self._gs_header = None
        self._gs_joined_steps = 0
        self._gs_joined = False
        self._gs_used = [True] * len(self._gs_params)
        self._gs_active = job.size
        # Mode allreduce with several workers: each step ends with its header (collectives.py).
        self._gs_ring = self._gs_mode == "allreduce" and job.size > 1 and not self._gs_rounds
        self.loss_scale_info = None  # (scale, skipped steps) a GradScaler sets for the metrics rows
        live.register(self)
        self._gs_begin_round()

    def _gs_begin_round(self):
        # With rounds, a round's first step begins before anything reads a parameter: it puts the
        # global model (PS: this round's pull) into the parameters.
        if self._gs_rounds and self._gs_step % self._gs_rounds == 0 and (
                not self._gs_total or self._gs_step < self._gs_total):
            self._gs_begin()

    # --- hooks ---

    def _gs_begin(self):
        lr = float(self.param_groups[0]["lr"]) if self._gs_ps else math.nan
        if not self._gs_adasum:
            self._gs_sync.begin_step(self._gs_step, False, lr)
        self._gs_begun = True

    def _gs_land(self, i):
        # The guard (above): parameter i is about to be read; its pull of this step must land.
        if self._gs_finished:
            guard.landed(self._gs_params[i])
            return
        if not self._gs_begun:
            self._gs_begin()
        if not self._gs_waited[i]:
            self._gs_sync.wait_params(i)
            self._gs_waited[i] = True
        guard.landed(self._gs_params[i])

    def _gs_make_hook(self, i):
        def hook(*unused):
            p = self._gs_params[i]
            if p.grad is None or p.grad.data_ptr() != self._gs_grad_ptrs[i]:
                # zero_grad(set_to_none=True) or a replaced .grad: back into the flat buffer.
                with torch.no_grad():
                    if p.grad is not None:
                        self._gs_grad_views[i].copy_(p.grad)
                    else:
                        self._gs_grad_views[i].zero_()
                p.grad = self._gs_grad_views[i]
            if self._gs_failure is not None:
                return  # the step failed: step() says why
            self._gs_counts[i] += 1
            self._gs_none[i] = False
            try:
                if not self._gs_begun:
                    self._gs_begin()
                if self._gs_counts[i] == self._gs_passes:
                    if self._gs_prescale != 1.0:
                        with torch.no_grad():
                            self._gs_grad_views[i].mul_(self._gs_prescale)
                    if not self._gs_adasum:
                        self._gs_sync.grad_ready(i)
            except GradsyncError as e:
                # Raised out of autograd's hook, a failure would unwind backward inside torch's
                # engine; it is kept and raised by step() (or synchronize()) instead.
                self._gs_failure = e
                return
            if self._gs_counts[i] > self._gs_passes:
                raise ValueError("parameter '%s': gradient computed %d times before step() (backward_passes_per_step=%d)"
                                 % (self._gs_names[i], self._gs_counts[i], self._gs_passes))
        return hook

    # --- the optimizer's interface ---

    def zero_grad(self, set_to_none=None):
        """Zeroes the gradients. They stay views of the flat gradient buffer; set_to_none
        (default: the installed torch's, False before torch 2.0) means what it means to torch's
        optimizer: a parameter that then gets no gradient before step() is skipped (not
        updated, its optimizer state untouched), where with zeroed gradients torch's optimizer
        steps it (momentum and weight decay move it). PS modes: begins the step first (its pulls
        go out, and the previous push has left the gradient buffer before it is overwritten)."""
        if self._gs_ps and not self._gs_begun and not self._gs_finished:
            self._gs_begin()
        if set_to_none is None:
            set_to_none = _SET_TO_NONE_DEFAULT
        if set_to_none:
            self._gs_none = [True] * len(self._gs_params)
        self._gs_flat_grads.zero_()
        for i, p in enumerate(self._gs_params):
            if p.grad is None or p.grad.data_ptr() != self._gs_grad_ptrs[i]:
                p.grad = self._gs_grad_views[i]

    def step(self, closure=None, loss=None):
        """Finishes the step: the gradient is averaged (all-reduce; then the wrapped optimizer
        steps) or pushed (PS; the shards update). `loss` (a float or a tensor) goes to the
        metrics row. Returns the closure's loss, if any. Inside skip_synchronize() the step only
        applies what synchronize() finished."""
        if self._gs_skip_sync and self._gs_synced is None:
            raise ValueError("step() inside skip_synchronize() needs synchronize() first (the gradient would "
                             "be this worker's own)")
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        return self._gs_finish(loss, closure is not None, apply=True)

    def synchronize(self):
        """Finishes the step's communication now, without stepping: all-reduce: the gradient
        buffer holds the average (the same bits on every rank) when it returns; PS: the push is
        sent. The next step() (or skip_step()) then only applies it. For loss scalers that must
        see the averaged gradient (gradsync.torch.GradScaler; Horovod's pattern with
        torch.cuda.amp.GradScaler: synchronize(), then scaler.step(opt))."""
        if self._gs_finished:
            raise ValueError("synchronize() after finish()")
        if self._gs_failure is not None:
            raise self._gs_failure
        if self._gs_synced is not None or self._gs_rounds:
            return  # with rounds the gradient stays this worker's: nothing to average before the step
        if not self._gs_begun:
            self._gs_begin()
        self._gs_straggle()
        self._gs_sync_started = time.perf_counter()
        self._gs_synced = self._gs_communicate()

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Horovod's: `opt.synchronize()`, then `with opt.skip_synchronize(): opt.step()` applies
        the synchronized gradient without communicating again (step() after synchronize() does
        so anyway)."""
        self._gs_skip_sync = True
        try:
            yield
        finally:
            self._gs_skip_sync = False

    def skip_step(self, loss=None):
        """Ends the step without the wrapped optimizer's update (a loss scaler's overflowed
        step): the communication is finished as in step(), the parameters stay as they are."""
        return self._gs_finish(loss, False, apply=False)

    def _gs_communicate(self, state=collectives.TRAINING):
        """The step's communication: the sync's finish_step (or, op=Adasum, nothing: step()
        combines the updates), then in mode allreduce the step header (collectives.step_header:
        who still trains, which tensors got a gradient on any worker). Returns the stats."""
        if self._gs_adasum:
            stats = dict(comm_ms=0.0, wait_ms=0.0, hidden_ms=0.0, blocked_ms=0.0, version_lag=math.nan,
                         clock_staleness=math.nan, loss_scale=math.nan, skipped_steps=0)
        else:
            if self._gs_ps and state == collectives.TRAINING:
                # A parameter whose .grad torch would have as None: the shards leave it and its
                # optimizer state alone, as torch's optimizer would.
                for i, present in enumerate(self._gs_present()):
                    if not present:
                        self._gs_sync.grad_absent(i)
            stats = self._gs_sync.finish_step()
        stats["control_bytes_sent"] = 0
        if self._gs_ring:
            # The step's header, its bytes apart from the gradient's.
            t = time.perf_counter()
            before = self._gs_sync.traffic()[0] if self._gs_adasum else stats["bytes_sent"]
            header = collectives.step_header(state, self._gs_header_steps(state),
                                             self._gs_present() if state == collectives.TRAINING else self._gs_counts)
            self._gs_header = header
            self._gs_active = len(header.active)
            self._gs_used = header.used
            stats["comm_ms"] += (time.perf_counter() - t) * 1e3
            self._gs_count_traffic(stats)
            stats["control_bytes_sent"] = stats["bytes_sent"] - before
        else:
            self._gs_used = self._gs_present()
        if self._gs_mode == "allreduce":
            if self._gs_predivide != 1.0:
                self._gs_flat_grads.mul_(self._gs_predivide)
            if self._gs_op is Sum:
                self._gs_flat_grads.mul_(float(self._gs_job.size))
            elif self._gs_active < self._gs_job.size and not self._gs_adasum:
                # Workers that joined contributed zeros: the average is over those still training
                # (as the shards' rounds are in the PS modes).
                self._gs_flat_grads.mul_(float(self._gs_job.size) / max(1, self._gs_active))
        return stats

    def _gs_present(self):
        """Per parameter, whether torch's optimizer would step it: it got a gradient this step,
        or its .grad is a tensor (zeroed by zero_grad(set_to_none=False), or left as it was)."""
        return [c > 0 or not (none or p.grad is None)
                for c, none, p in zip(self._gs_counts, self._gs_none, self._gs_params)]

    def _gs_header_steps(self, state):
        # A worker that joined says the steps it trained (join() returns the one with the most).
        return self._gs_step if state != collectives.JOINED else self._gs_joined_steps

    def _gs_finish(self, loss, from_closure, apply):
        if self._gs_finished:
            raise ValueError("step() after finish()" if not self._gs_joined else "step() after join()")
        if self._gs_failure is not None:
            raise self._gs_failure
        if not self._gs_begun and self._gs_synced is None:
            self._gs_begin()
        result = None
        delay_ms = self._gs_straggle()
        if self._gs_rounds:
            # Local SGD / DiLoCo: the wrapped optimizer steps this worker's own model first (its time
            # counts in compute_ms, up to `started`); the step's exchange (the pseudo-gradient, when
            # it ends a round) follows.
            self._gs_used = self._gs_present()
            if apply:
                with trace_span("optimizer", "compute"):
                    result = self._gs_apply(None)
        if self._gs_synced is not None:
            started = self._gs_sync_started
            stats, self._gs_synced = self._gs_synced, None
        else:
            started = time.perf_counter()
            stats = self._gs_communicate()
        compute_ms = (started - self._gs_last_end) * 1e3
        if not self._gs_ps and apply and not self._gs_rounds:
            t = time.perf_counter()
            with trace_span("optimizer", "compute"):
                result = self._gs_apply(stats)
            compute_ms += (time.perf_counter() - t) * 1e3
        compute_ms = max(0.0, compute_ms - stats["blocked_ms"])
        self._gs_end_step()
        if self.loss_scale_info is not None:
            stats["loss_scale"], stats["skipped_steps"] = self.loss_scale_info
        if self._gs_rounds:
            self._gs_begin_round()
        stats["delay_ms"] = delay_ms
        self.last_stats = stats
        value = None if loss is None else float(loss)
        self._gs_recorder.step(self._gs_step, stats, max(0.0, compute_ms - delay_ms), value)
        self._gs_last_end = time.perf_counter()
        return loss if from_closure else result

    def _gs_straggle(self):
        # The job's injected delay (a spec's straggler: --straggle), once a step, after its
        # computation and before its communication, as gradsync-worker sleeps it. Returns its ms.
        if self._gs_delay_ms is None:
            self._gs_delay_ms = self._gs_sync.straggle((time.perf_counter() - self._gs_last_end) * 1e3)
        return self._gs_delay_ms

    def _gs_end_step(self):
        self._gs_delay_ms = None
        self._gs_step += 1
        self._gs_counts = [0] * len(self._gs_params)
        self._gs_waited = [False] * len(self._gs_params)
        self._gs_begun = False
        if self._gs_guarded:
            guard.pending(self._gs_guarded)  # the next step's values are on their way

    def _gs_apply(self, stats, own_step=True):
        """The wrapped optimizer's step (all-reduce and local modes). A parameter that got no
        gradient this step (on any worker) is left alone, as torch leaves one whose .grad is
        None. op=Adasum: each worker steps on its own gradient, and the updates are combined
        per tensor with Adasum (Horovod's _DistributedAdasumOptimizer)."""
        skipped = [i for i, used in enumerate(self._gs_used) if not used]
        for i in skipped:
            self._gs_params[i].grad = None
        try:
            if self._gs_adasum:
                before = self._gs_flat_params.clone()
                result = super(self.__class__, self).step() if own_step else None  # joined: a zero update
                t = time.perf_counter()
                delta = self._gs_flat_params - before
                gathered = [torch.frombuffer(bytearray(b), dtype=torch.float32)
                            for b in self._gs_job.allgather(delta.numpy().tobytes())]
                with torch.no_grad():
                    for i, (p, offset) in enumerate(zip(self._gs_params, self._gs_sync.offsets)):
                        n = p.numel()
                        combined = collectives.adasum([g[offset:offset + n] for g in gathered])
                        self._gs_flat_params[offset:offset + n] = before[offset:offset + n] + combined
                stats["comm_ms"] += (time.perf_counter() - t) * 1e3
                self._gs_count_traffic(stats)
                return result
            return super(self.__class__, self).step()
        finally:
            for i in skipped:
                self._gs_params[i].grad = self._gs_grad_views[i]

    def state_dict(self):
        """torch's state_dict. PS modes: the state is the shards' (momentum buffers, Adam's
        moments and step) at this worker's step, in torch's names and shapes (ps_state.py): after
        step(), the state once that step's round is applied, which with the model's parameters
        read then (they wait for that step's pulls) is a checkpoint a new job resumes bit for bit
        (bsp)."""
        sd = super(self.__class__, self).state_dict()
        if self._gs_ps:
            sd["state"] = ps_state.to_torch(self._gs_sync.optimizer_state(), self._gs_params, self._gs_kind,
                                            ps_state.param_index(self.param_groups))
        return sd

    def load_state_dict(self, state_dict):
        """torch's load_state_dict. PS modes: the parameter groups' settings here, the state on
        the shards (one copy for every worker; it is set at this worker's step, so call it before
        training, on one worker or on every worker with the same state)."""
        if not self._gs_ps:
            return super(self.__class__, self).load_state_dict(state_dict)
        super(self.__class__, self).load_state_dict({"state": {}, "param_groups": state_dict["param_groups"]})
        self._gs_sync.set_optimizer_state(ps_state.from_torch(
            state_dict["state"], self._gs_params, self._gs_kind,
            ps_state.param_index(self.param_groups)))

    # --- gradsync's own ---

    @property
    def steps(self):
        """Steps finished (a rejoining worker starts where the job is)."""
        return self._gs_step

    @property
    def steps_per_epoch(self):
        """For the epoch column of the metrics rows (None: the column stays 0)."""
        return self._gs_recorder.steps_per_epoch

    @steps_per_epoch.setter
    def steps_per_epoch(self, n):
        self._gs_recorder.steps_per_epoch = int(n) if n else None

    @property
    def clock_staleness(self):
        """PS: the clock staleness of the last step's pulls (max over the shards); NaN otherwise."""
        return self.last_stats.get("clock_staleness", math.nan)

    @property
    def version_lag(self):
        """PS: the version lag of the last step's push (max over the shards); NaN otherwise."""
        return self.last_stats.get("version_lag", math.nan)

    def _gs_count_traffic(self, stats):
        """The step's stats take this process's bytes now, on the wire and through shared memory."""
        stats["bytes_sent"], stats["bytes_received"] = self._gs_sync.traffic()
        stats["shm_bytes_sent"], stats["shm_bytes_received"] = self._gs_sync.shm_traffic()

    def traffic(self):
        """(bytes sent, bytes received) by this process on the wire for the job so far."""
        return tuple(self._gs_sync.traffic())

    def shm_traffic(self):
        """(bytes sent, bytes received) through shared memory with processes of this host (PS lanes,
        the all-reduce's shared-memory group), counted as the wire would count them; not in traffic()."""
        return tuple(self._gs_sync.shm_traffic())

    @property
    def sync_kind(self):
        """'ps-overlap', 'ps', 'allreduce-overlap', 'allreduce', 'rounds-ps', 'rounds-allreduce' (--sync-every)
        or 'local'."""
        return self._gs_sync.kind

    @property
    def flat_parameters(self):
        """The flat parameter buffer every parameter is a view of."""
        return self._gs_flat_params

    @property
    def flat_gradients(self):
        return self._gs_flat_grads

    def synchronize_parameters(self):
        """PS: waits until every parameter of the current step has arrived (for reading them
        outside a forward, e.g. to save them). Other modes: nothing to wait for."""
        if not self._gs_ps or self._gs_finished:
            return
        if not self._gs_begun:
            self._gs_begin()
        for i in range(len(self._gs_params)):
            self._gs_land(i)

    def record_evaluation(self, test_loss, test_accuracy):
        """Writes an evaluation row (test loss, test accuracy in [0, 1], and the mean training
        loss since the previous one, which it returns). After finish() (the evaluation of the
        final parameters) it also rewrites OUT/worker-<rank>.json with this accuracy."""
        mean_loss = self._gs_recorder.evaluation(self._gs_step, float(test_loss), float(test_accuracy), self.traffic(),
                                                    self.shm_traffic())
        if self._gs_finished:
            self._gs_write_summary()
        return mean_loss

    def finish(self, evaluate=True):
        """After the last step: every worker's updates are applied everywhere (PS: the last push
        answered, then the workers' barrier; all-reduce: the ring's barrier). With evaluate, the
        exact final parameters are in the model (PS: pulled from the shards). Writes
        OUT/worker-<rank>.json. The optimizer cannot step afterwards. Every worker must have run
        the same number of steps: a worker that runs out of data calls gradsync.torch.join()
        instead; otherwise the workers still training fail, naming it."""
        if self._gs_finished:
            return
        if self._gs_synced is not None:
            raise ValueError("finish() between synchronize() and step()")
        if self._gs_ring:
            # One step with a zero gradient and the state "ended": the same as the others' last
            # one when every worker ends here; the others' next one (they fail, naming this
            # worker, and so does this worker) when they still train.
            self._gs_job.training_ended(self._gs_step, False)
            trained = self._gs_step
            self._gs_zero_step(collectives.ENDED)
            self._gs_step = trained  # the end's step trains nothing: steps (and the summary's) stay these
        self._gs_end(evaluate, join=False)

    def _gs_zero_step(self, state):
        # Mode allreduce: a step with a zero gradient through the same collectives as a training
        # step (a worker that joined, or the end of training), then the same update, so that this
        # replica stays the others'. Returns the step header.
        if self._gs_finished:
            raise GradsyncError("a training step of an optimizer that finish() ended on this worker")
        self._gs_begin()
        self._gs_flat_grads.zero_()
        self._gs_counts = [0] * len(self._gs_params)
        if not self._gs_adasum:
            for i in reversed(range(len(self._gs_params))):
                self._gs_sync.grad_ready(i)
        stats = self._gs_communicate(state)
        if self._gs_header.active:
            self._gs_apply(stats, own_step=False)
        self._gs_end_step()
        return self._gs_header

    def _gs_end(self, evaluate, join):
        self._gs_finished = True
        for h in self._gs_hooks:
            h.remove()
        self._gs_hooks = []
        self._gs_unguard()
        if join and self._gs_mode in _PS_MODES:
            self._gs_sync.end_training(bool(evaluate), join=True)
        else:
            self._gs_sync.end_training(bool(evaluate))
        self._gs_write_summary()

    def _gs_write_summary(self):
        # OUT/worker-<rank>.json: the C++ worker's summary, with the replies' counts (PS) and a
        # digest of the parameters the model holds.
        replies = self._gs_sync.reply_counts() if self._gs_mode in _PS_MODES else None
        digest = hashlib.sha256(self._gs_flat_params.numpy().tobytes()).hexdigest()
        self._gs_recorder.finish(self.traffic(), replies=replies, params_sha256=digest, shm=self.shm_traffic())

    def _gs_unguard(self):
        # After the last step nothing lands any more: the parameters get their own class back.
        guard.unguard(self._gs_params, self._gs_guarded)
        self._gs_guarded = {}


def DistributedOptimizer(optimizer, named_parameters=None, compression=None, backward_passes_per_step=1,
                         op=Average, gradient_predivide_factor=1.0, error_feedback=None, steps_per_epoch=None,
                         total_steps=None, **unused):
    """Wraps a torch optimizer for the job's mode (gradsync.init() first). Returns an instance of
    a subclass of the optimizer's own class, built over the same parameter groups (its state
    starts empty: wrap before training).

    named_parameters: model.named_parameters(), so that errors and the cross-worker layout check
        name parameters (default: param.0, param.1, ...). Parameters are synchronized in this
        order; every worker must declare the same names and shapes (checked: ValueError naming
        the first that differs).
    compression: Compression.none / .fp16 (Horovod's), any of gradsync's (Compression.topk(0.01),
        ...), or a codec string ("fp16", "int8", "qsgd:L", "sign", "topk:R", "randomk:R");
        default the job's --compress. error_feedback: default the job's --error-feedback.
    backward_passes_per_step: backward passes that accumulate into one step's gradient.
    op: Average (default), Sum (the gradients' sum), or Adasum (mode allreduce: each worker
        steps on its own gradient and the updates are combined per tensor with Adasum, as
        Horovod's). gradient_predivide_factor: op=Average, mode allreduce: the gradient is
        divided by it before the sum and multiplied back after (the same average).
    Horovod's num_groups, groups, sparse_as_dense and process_set are accepted and ignored.
    steps_per_epoch, total_steps: for the epoch column of the metrics rows and the shards' records.
    """
    for name in unused:
        if name not in ("num_groups", "groups", "sparse_as_dense", "process_set"):
            raise TypeError("DistributedOptimizer() got an unexpected keyword argument '%s'" % name)
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), dict(_DistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, compression, error_feedback, backward_passes_per_step,
               steps_per_epoch, total_steps, optimizer, op, gradient_predivide_factor)
