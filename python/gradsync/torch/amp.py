"""Mixed precision with gradsync: the job's --precision, and dynamic loss scaling for fp16 that
every worker applies alike.

    scaler = gs.torch.GradScaler()                   # enabled when the job runs --precision=fp16
    with gs.torch.autocast():                         # bf16 compute on the CPU (torch.autocast)
        loss = F.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(opt, loss=loss)                       # opt: a gs.torch.DistributedOptimizer
    scaler.update()

The gradients travel in the precision's 16 bits (the job's codec unless one is named). GradScaler
has torch.cuda.amp.GradScaler's calls and rule (a step whose gradient holds an inf or NaN is
skipped and the scale multiplied by backoff_factor; growth_interval good steps in a row multiply
it by growth_factor) and it works on the CPU too. What it judges is the gradient the update uses:
  all-reduce  the averaged gradient (opt.synchronize() first), the same bits on every rank, so
              every rank skips the same steps;
  bsp/ssp/asp this worker's own gradient, unscaled before it is pushed; an overflowed one is
              pushed as zeros (a bsp round needs every worker's push).
With torch.cuda.amp.GradScaler instead, call opt.synchronize() before scaler.step(opt) in
all-reduce mode (as with Horovod), so that every rank sees the same averaged gradient.

On the CPU, torch 1.13's autocast computes in bfloat16 only: autocast() then runs bf16 compute
for --precision=bf16 and leaves --precision=fp16 in fp32 compute (fp16 gradients on the wire,
with loss scaling); on a GPU it is torch.autocast("cuda") in the job's 16-bit type.
"""

import contextlib
import math

import torch

from gradsync import _job

_PS_MODES = ("bsp", "ssp", "asp")


def precision():
    """The job's --precision: "fp32", "bf16" or "fp16"."""
    return _job.job().config.get("precision", "fp32") or "fp32"


def autocast(device_type="cpu"):
    """A torch.autocast context in the job's precision where torch offers it (see above); a
    context that does nothing for fp32."""
    p = precision()
    if p == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if p == "bf16" else torch.float16
    if device_type == "cpu" and dtype == torch.float16:
        return contextlib.nullcontext()  # torch 1.13's CPU autocast has no fp16
    return torch.autocast(device_type, dtype=dtype)


class GradScaler:
    """Dynamic loss scaling over a gs.torch.DistributedOptimizer (see the module's text).
    enabled: default True when the job runs --precision=fp16. init_scale: default the job's
    --initial-loss-scale (65536)."""

    def __init__(self, init_scale=None, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000, enabled=None):
        config = _job.job().config
        self._enabled = precision() == "fp16" if enabled is None else bool(enabled)
        self._scale = float(init_scale if init_scale is not None else config.get("initial_loss_scale", 65536.0))
        if not (math.isfinite(self._scale) and self._scale > 0):
            raise ValueError("init_scale must be a finite number > 0, not %r" % self._scale)
        self._growth, self._backoff, self._interval = float(growth_factor), float(backoff_factor), int(growth_interval)
        self._good = 0
        self._skipped = 0
        self._found_inf = None  # the verdict of the last step(), for update()

    def is_enabled(self):
        return self._enabled

    def get_scale(self):
        return self._scale if self._enabled else 1.0

    @property
    def skipped_steps(self):
        """Steps skipped so far because their gradient overflowed."""
        return self._skipped

    def scale(self, loss):
        return loss * self._scale if self._enabled else loss

    def step(self, opt, loss=None):
        """Unscales the gradient the update uses and applies it, or skips the step when it holds
        an inf or NaN. Returns what opt.step() returns (None for a skipped step)."""
        if not self._enabled:
            return opt.step(loss=loss)
        grads = opt.flat_gradients
        ps = opt._gs_mode in _PS_MODES
        if not ps:
            opt.synchronize()
        finite = bool(torch.isfinite(grads).all())
        self._found_inf = not finite
        opt.loss_scale_info = (self._scale, self._skipped + (0 if finite else 1))
        with torch.no_grad():
            if finite:
                grads.mul_(1.0 / self._scale)
            elif ps:
                grads.zero_()
        if finite or ps:
            return opt.step(loss=loss)
        return opt.skip_step(loss=loss)

    def update(self):
        """After step(): halves the scale after an overflow, doubles it after growth_interval good
        steps in a row."""
        if not self._enabled or self._found_inf is None:
            return
        if self._found_inf:
            self._skipped += 1
            self._good = 0
            self._scale *= self._backoff
        else:
            self._good += 1
            if self._good >= self._interval:
                self._good = 0
                self._scale *= self._growth
        self._found_inf = None

    def state_dict(self):
        return {"scale": self._scale, "good": self._good, "skipped": self._skipped}

    def load_state_dict(self, state):
        self._scale, self._good, self._skipped = float(state["scale"]), int(state["good"]), int(state["skipped"])
