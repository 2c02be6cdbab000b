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
             whichever comes first; the previous push has then left the gradient buffer), and each
             module's forward pre-hook waits only for that module's own parameters. step() sends
             what is left and does not run the wrapped optimizer.
  local      nothing is synchronized; step() is the wrapped optimizer's.
"""

import math
import time
import weakref

import torch

from gradsync import _job, _native
from gradsync._job import trace_span
from gradsync.torch.metrics import Recorder

_PS_MODES = ("bsp", "ssp", "asp")


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
                 steps_per_epoch, total_steps, wrapped):
        super(self.__class__, self).__init__(params)
        job = _job.job()
        self._gs_job = job
        self._gs_mode = job.mode
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
        spec = _ps_optimizer_spec(wrapped, self._gs_mode) if self._gs_mode in _PS_MODES else _native.OptimizerSpec()
        feedback = -1 if error_feedback is None else int(bool(error_feedback))
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
        self._gs_waited = [False] * len(self._gs_params)
        self._gs_begun = False
        self._gs_finished = False
        self._gs_ps = self._gs_mode in _PS_MODES
        self.last_stats = {}
        self._gs_step = self._gs_sync.start(int(total_steps or 0), int(steps_per_epoch or 1))
        self._gs_recorder = Recorder(job, int(self._gs_flat_params.numel()), steps_per_epoch)
        self._gs_hooks = []
        self._gs_accumulators = []
        for i, p in enumerate(self._gs_params):
            accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
            self._gs_hooks.append(accumulator.register_hook(self._gs_make_hook(i)))
            self._gs_accumulators.append(accumulator)
        if self._gs_ps:
            self._gs_module_waits = weakref.WeakKeyDictionary()
            self._gs_hooks.append(torch.nn.modules.module.register_module_forward_pre_hook(self._gs_pre_forward))
        self._gs_last_end = time.perf_counter()
        self._gs_synced = None  # the stats of a synchronize() the coming step() finishes
        self.loss_scale_info = None  # (scale, skipped steps) a GradScaler sets for the metrics rows

    # --- hooks ---

    def _gs_begin(self):
        lr = float(self.param_groups[0]["lr"]) if self._gs_ps else math.nan
        self._gs_sync.begin_step(self._gs_step, False, lr)
        self._gs_begun = True

    def _gs_pre_forward(self, module, inputs):
        # Called before every module's forward in the process: which of this optimizer's
        # parameters a module owns is looked up once per module.
        waits = self._gs_module_waits.get(module)
        if waits is None:
            index = self._gs_index
            waits = tuple(index[id(p)] for p in module._parameters.values() if p is not None and id(p) in index)
            self._gs_module_waits[module] = waits
        if not waits:
            return
        if not self._gs_begun and not self._gs_finished:
            self._gs_begin()
        for i in waits:
            if not self._gs_waited[i]:
                self._gs_sync.wait_params(i)
                self._gs_waited[i] = True

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
            if not self._gs_begun:
                self._gs_begin()
            self._gs_counts[i] += 1
            if self._gs_counts[i] == self._gs_passes:
                self._gs_sync.grad_ready(i)
            elif self._gs_counts[i] > self._gs_passes:
                raise ValueError("parameter '%s': gradient computed %d times before step() (backward_passes_per_step=%d)"
                                 % (self._gs_names[i], self._gs_counts[i], self._gs_passes))
        return hook

    # --- the optimizer's interface ---

    def zero_grad(self, set_to_none=False):
        """Zeroes the gradients. They stay views of the flat gradient buffer (set_to_none is
        accepted and ignored). PS modes: begins the step first (its pulls go out, and the
        previous push has left the gradient buffer before it is overwritten)."""
        if self._gs_ps and not self._gs_begun and not self._gs_finished:
            self._gs_begin()
        self._gs_flat_grads.zero_()
        for i, p in enumerate(self._gs_params):
            if p.grad is None or p.grad.data_ptr() != self._gs_grad_ptrs[i]:
                p.grad = self._gs_grad_views[i]

    def step(self, closure=None, loss=None):
        """Finishes the step: the gradient is averaged (all-reduce; then the wrapped optimizer
        steps) or pushed (PS; the shards update). `loss` (a float or a tensor) goes to the
        metrics row. Returns the closure's loss, if any."""
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
        if self._gs_synced is not None:
            return
        if not self._gs_begun:
            self._gs_begin()
        self._gs_sync_started = time.perf_counter()
        self._gs_synced = self._gs_sync.finish_step()

    def skip_step(self, loss=None):
        """Ends the step without the wrapped optimizer's update (a loss scaler's overflowed
        step): the communication is finished as in step(), the parameters stay as they are."""
        return self._gs_finish(loss, False, apply=False)

    def _gs_finish(self, loss, from_closure, apply):
        if self._gs_finished:
            raise ValueError("step() after finish()")
        if not self._gs_begun and self._gs_synced is None:
            self._gs_begin()
        if self._gs_synced is not None:
            started = self._gs_sync_started
            stats, self._gs_synced = self._gs_synced, None
        else:
            started = time.perf_counter()
            stats = self._gs_sync.finish_step()
        compute_ms = (started - self._gs_last_end) * 1e3
        result = None
        if not self._gs_ps and apply:
            t = time.perf_counter()
            with trace_span("optimizer", "compute"):
                result = super(self.__class__, self).step()
            compute_ms += (time.perf_counter() - t) * 1e3
        compute_ms = max(0.0, compute_ms - stats["blocked_ms"])
        self._gs_step += 1
        self._gs_counts = [0] * len(self._gs_params)
        self._gs_waited = [False] * len(self._gs_params)
        self._gs_begun = False
        if self.loss_scale_info is not None:
            stats["loss_scale"], stats["skipped_steps"] = self.loss_scale_info
        self.last_stats = stats
        value = None if loss is None else float(loss)
        self._gs_recorder.step(self._gs_step, stats, compute_ms, value)
        self._gs_last_end = time.perf_counter()
        return loss if from_closure else result

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

    def traffic(self):
        """(bytes sent, bytes received) by this process for the job so far."""
        return tuple(self._gs_sync.traffic())

    @property
    def sync_kind(self):
        """'ps-overlap', 'ps', 'allreduce-overlap', 'allreduce' or 'local'."""
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
            if not self._gs_waited[i]:
                self._gs_sync.wait_params(i)
                self._gs_waited[i] = True

    def record_evaluation(self, test_loss, test_accuracy):
        """Writes an evaluation row (test loss, test accuracy in [0, 1], and the mean training
        loss since the previous one, which it returns). After finish() (the evaluation of the
        final parameters) it also rewrites OUT/worker-<rank>.json with this accuracy."""
        mean_loss = self._gs_recorder.evaluation(self._gs_step, float(test_loss), float(test_accuracy), self.traffic())
        if self._gs_finished:
            self._gs_recorder.finish(self.traffic())
        return mean_loss

    def finish(self, evaluate=True):
        """After the last step: every worker's updates are applied everywhere (PS: the last push
        answered, then the workers' barrier; all-reduce: the ring's barrier). With evaluate, the
        exact final parameters are in the model (PS: pulled from the shards). Writes
        OUT/worker-<rank>.json. The optimizer cannot step afterwards."""
        if self._gs_finished:
            return
        self._gs_finished = True
        for h in self._gs_hooks:
            h.remove()
        self._gs_hooks = []
        self._gs_sync.end_training(bool(evaluate))
        self._gs_recorder.finish(self.traffic())


def DistributedOptimizer(optimizer, named_parameters=None, compression=None, error_feedback=None,
                         backward_passes_per_step=1, steps_per_epoch=None, total_steps=None):
    """Wraps a torch optimizer for the job's mode (gradsync.init() first). Returns an instance of
    a subclass of the optimizer's own class, built over the same parameter groups (its state
    starts empty: wrap before training).

    named_parameters: model.named_parameters(), so that errors and the cross-worker layout check
        name parameters (default: param.0, param.1, ...). Parameters are synchronized in this
        order; every worker must declare the same names and shapes (checked: ValueError naming
        the first that differs).
    compression: a codec ("fp16", "int8", "qsgd:L", "sign", "topk:R", "randomk:R"); default the
        job's --compress. error_feedback: default the job's --error-feedback.
    backward_passes_per_step: backward passes that accumulate into one step's gradient.
    steps_per_epoch, total_steps: for the epoch column of the metrics rows and the shards' records.
    """
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), dict(_DistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, compression, error_feedback, backward_passes_per_step,
               steps_per_epoch, total_steps, optimizer)


def broadcast_parameters(params, root_rank=0):
    """Overwrites every worker's tensors with root_rank's, in place (Horovod's
    broadcast_parameters): `params` is a state_dict, model.named_parameters() or a list of
    tensors. Every worker must pass the same tensors (names, shapes, dtypes) in the same order.
    DistributedOptimizer already starts every worker from worker 0's parameters; this is for the
    rest of the state (buffers) and for users of allreduce_hook."""
    job = _job.job()
    if isinstance(params, dict):
        items = sorted(params.items())
    else:
        items = list(params)
    tensors = [t[1] if isinstance(t, tuple) else t for t in items]
    tensors = [t for t in tensors if isinstance(t, torch.Tensor)]
    if job.size == 1 or not tensors:
        return
    for t in tensors:
        if t.device.type != "cpu":
            raise ValueError("broadcast_parameters: CPU tensors only (got one on %s)" % t.device)
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
