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
  --sync-every=H  (local SGD / DiLoCo) the wrapped optimizer steps this worker's own model every
             step; every H steps the pseudo-gradients are exchanged in the mode's way.
Each of these (and op=Adasum in mode allreduce) is a strategy of strategies.py, chosen once when
the optimizer is built; the optimizer asks it wherever they differ.
"""

import contextlib
import hashlib
import inspect
import math
import time

import torch

from gradsync import _job, _native
from gradsync._job import GradsyncError
from gradsync.torch import collectives, embedding, guard, live, strategies
from gradsync.torch.collectives import Average
from gradsync.torch.compression import codec_of
from gradsync.torch.metrics import Recorder

# What torch's own Optimizer.zero_grad() does by default (False before torch 2.0, True since).
_SET_TO_NONE_DEFAULT = inspect.signature(torch.optim.Optimizer.zero_grad).parameters["set_to_none"].default


def _named_parameters(param_groups, named_parameters):
    """[(name, parameter)] of the parameters to synchronize (those that require a gradient), in
    named_parameters' order; ValueError unless they are exactly the optimizer's, once each, float32
    on the CPU."""
    in_groups = [p for g in param_groups for p in g["params"]]
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
    return named


class _DistributedOptimizer(torch.optim.Optimizer):
    # The methods of this class are copied into a subclass of the wrapped optimizer's class
    # (DistributedOptimizer below), so `self` is an SGD, an Adam, ... and LR schedulers accept it.

    def __init__(self, params, named_parameters, compression, error_feedback, backward_passes_per_step,
                 steps_per_epoch, total_steps, wrapped, op, gradient_predivide_factor, sparse_as_dense=False):
        super(self.__class__, self).__init__(params)
        job = _job.job()
        self._gs_job = job
        self._gs_mode = job.mode
        # The sync kind, chosen once: every difference between the kinds is its (strategies.py).
        self._gs_strategy = strategies.choose(job, collectives.resolve_op(None, op), gradient_predivide_factor)
        compression = codec_of(compression)
        named = _named_parameters(self.param_groups, named_parameters)
        if backward_passes_per_step < 1:
            raise ValueError("backward_passes_per_step must be >= 1")
        spec = self._gs_strategy.optimizer_spec(wrapped)
        feedback = -1 if error_feedback is None else int(bool(error_feedback))
        self._gs_strategy.check_compression(compression)
        # Its embedding tables (embedding.py), plain sparse embeddings' weights out of `named`.
        self._gs_tables, named, tables = embedding.tables_of(named, wrapped, sparse_as_dense, job.config)
        self._gs_strategy.check_tables(self._gs_tables)
        self._gs_sync = _native.Sync(job, [(n, list(p.shape)) for n, p in named], spec, compression or "", feedback,
                                     tables)
        self._gs_table_rows = embedding.bind(self._gs_tables, self)  # rows the last step handed over
        self._gs_names = [n for n, _ in named]
        self._gs_params = [p for _, p in named]
        self._gs_passes = backward_passes_per_step
        self._gs_bind_to_flat_buffers()
        self._gs_counts = [0] * len(self._gs_params)
        # Per parameter: torch's .grad would be None now (no gradient yet, or none since a
        # zero_grad(set_to_none=True)); with no gradient this step, torch's optimizer skips it.
        self._gs_none = [True] * len(self._gs_params)
        self._gs_waited = [False] * len(self._gs_params)
        self._gs_begun = False
        self._gs_finished = False
        self.last_stats = {}
        self._gs_total = int(total_steps or 0)
        self._gs_delay_ms = None  # this step's injected delay, once slept
        self._gs_step = self._gs_sync.start(self._gs_total, int(steps_per_epoch or 1))
        self._gs_recorder = Recorder(job, int(self._gs_flat_params.numel()), steps_per_epoch)
        self._gs_hook_accumulators()
        self._gs_guarded = self._gs_strategy.guard(self)
        self._gs_last_end = time.perf_counter()
        self._gs_synced = None  # the stats of a synchronize() the coming step() finishes
        self._gs_skip_sync = False  # inside skip_synchronize()
        self._gs_failure = None  # a GradsyncError a gradient hook met, raised by step()
        self._gs_joined_steps = 0
        self._gs_joined = False
        self._gs_used = [True] * len(self._gs_params)
        self.loss_scale_info = None  # (scale, skipped steps) a GradScaler sets for the metrics rows
        live.register(self)
        self._gs_strategy.ready(self)

    def _gs_bind_to_flat_buffers(self):
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

    def _gs_hook_accumulators(self):
        # Each parameter's gradient accumulator calls its hook when backward has produced it.
        self._gs_hooks = []
        self._gs_accumulators = []
        for i, p in enumerate(self._gs_params):
            accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
            self._gs_hooks.append(accumulator.register_hook(self._gs_make_hook(i)))
            self._gs_accumulators.append(accumulator)

    def _gs_super(self):
        # The wrapped optimizer's own methods (this class's are copied into a subclass of its class).
        return super(self.__class__, self)

    # --- hooks ---

    def _gs_begin(self):
        self._gs_strategy.begin(self)
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
                    prescale = self._gs_strategy.prescale
                    if prescale != 1.0:
                        with torch.no_grad():
                            self._gs_grad_views[i].mul_(prescale)
                    self._gs_strategy.grad_ready(self, i)
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
        self._gs_strategy.before_zero_grad(self)
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
        if self._gs_synced is not None or not self._gs_strategy.averages_before_step:
            return  # (with rounds the gradient stays this worker's: nothing to average before the step)
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
        """The step's communication (the strategy's: the sync's finish_step, or, op=Adasum,
        nothing: step() combines the updates; then in mode allreduce the step header). Sets
        _gs_used, returns the stats."""
        # The step's row gradients, summed per id, go with its exchange (the sync's finish_step).
        self._gs_table_rows = sum(t.hand_over() for t in self._gs_tables)
        return self._gs_strategy.communicate(self, state)

    def _gs_present(self):
        """Per parameter, whether torch's optimizer would step it: it got a gradient this step,
        or its .grad is a tensor (zeroed by zero_grad(set_to_none=False), or left as it was)."""
        return [c > 0 or not (none or p.grad is None)
                for c, none, p in zip(self._gs_counts, self._gs_none, self._gs_params)]

    def _gs_finish(self, loss, from_closure, apply):
        if self._gs_finished:
            raise ValueError("step() after finish()" if not self._gs_joined else "step() after join()")
        if self._gs_failure is not None:
            raise self._gs_failure
        if not self._gs_begun and self._gs_synced is None:
            self._gs_begin()
        delay_ms = self._gs_straggle()
        # Rounds: the wrapped optimizer steps this worker's own model before the exchange (its
        # time counts in compute_ms, up to `started`); all-reduce and local: after it.
        result = self._gs_strategy.step_before_exchange(self, apply)
        if self._gs_synced is not None:
            started = self._gs_sync_started
            stats, self._gs_synced = self._gs_synced, None
        else:
            started = time.perf_counter()
            stats = self._gs_communicate()
        compute_ms = (started - self._gs_last_end) * 1e3
        after, apply_ms = self._gs_strategy.step_after_exchange(self, stats, apply)
        result = result if after is None else after
        compute_ms += apply_ms
        compute_ms = max(0.0, compute_ms - stats["blocked_ms"])
        self._gs_end_step()
        if self.loss_scale_info is not None:
            stats["loss_scale"], stats["skipped_steps"] = self.loss_scale_info
        self._gs_strategy.ready(self)
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
        """The wrapped optimizer's step (all-reduce and local modes; op=Adasum: the strategy
        combines the workers' updates). A parameter that got no gradient this step (on any
        worker) is left alone, as torch leaves one whose .grad is None."""
        skipped = [i for i, used in enumerate(self._gs_used) if not used]
        for i in skipped:
            self._gs_params[i].grad = None
        try:
            return self._gs_strategy.apply(self, stats, own_step)
        finally:
            for i in skipped:
                self._gs_params[i].grad = self._gs_grad_views[i]

    def state_dict(self):
        """torch's state_dict. PS modes: the state is the shards' (momentum buffers, Adam's
        moments and step) at this worker's step, in torch's names and shapes (ps_state.py): after
        step(), the state once that step's round is applied, which with the model's parameters
        read then (they wait for that step's pulls) is a checkpoint a new job resumes bit for bit
        (bsp)."""
        return self._gs_strategy.state_dict(self, super(self.__class__, self).state_dict())

    def load_state_dict(self, state_dict):
        """torch's load_state_dict. PS modes: the parameter groups' settings here, the state on
        the shards (one copy for every worker; it is set at this worker's step, so call it before
        training, on one worker or on every worker with the same state)."""
        return self._gs_strategy.load_state_dict(self, state_dict)

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
    def table_rows(self):
        """Rows of the embedding tables (gradsync.torch.Embedding) whose gradients the last step
        handed over, over every table (0 without tables)."""
        return self._gs_table_rows

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
        self._gs_strategy.synchronize_parameters(self)

    def record_evaluation(self, test_loss, test_accuracy, test_auc=None):
        """Writes an evaluation row (test loss, test accuracy in [0, 1], the test AUC of a model
        that scores by a probability when given, and the mean training loss since the previous
        one, which it returns). After finish() (the evaluation of the final parameters) it also
        rewrites OUT/worker-<rank>.json with this accuracy."""
        mean_loss = self._gs_recorder.evaluation(self._gs_step, float(test_loss), float(test_accuracy), self.traffic(),
                                                    self.shm_traffic(),
                                                    float(test_auc) if test_auc is not None else math.nan)
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
        self._gs_strategy.finish(self)  # mode allreduce: a last step with a zero gradient
        self._gs_end(evaluate, join=False)

    def _gs_end(self, evaluate, join):
        self._gs_finished = True
        for h in self._gs_hooks:
            h.remove()
        self._gs_hooks = []
        self._gs_unguard()
        self._gs_strategy.end_training(self, evaluate, join)
        self._gs_write_summary()

    def _gs_write_summary(self):
        # OUT/worker-<rank>.json: the C++ worker's summary, with the replies' counts (PS) and a
        # digest of the parameters the model holds.
        replies = self._gs_strategy.reply_counts(self)
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
    sparse_as_dense: False (default): the weight of a plain nn.Embedding / EmbeddingBag made with
        sparse=True travels as an embedding table's rows (only the rows a step touched); True:
        as Horovod's, its gradient is densified into the flat buffer with the others.
    Horovod's num_groups, groups and process_set are accepted and ignored.
    steps_per_epoch, total_steps: for the epoch column of the metrics rows and the shards' records.
    """
    for name in unused:
        if name not in ("num_groups", "groups", "sparse_as_dense", "process_set"):
            raise TypeError("DistributedOptimizer() got an unexpected keyword argument '%s'" % name)
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), dict(_DistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, compression, error_feedback, backward_passes_per_step,
               steps_per_epoch, total_steps, optimizer, op, gradient_predivide_factor,
               bool(unused.get("sparse_as_dense", False)))
