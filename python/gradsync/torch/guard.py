"""The parameter guard (PS modes).

In the PS modes a step's pulls land in the parameter buffer while forward runs. A parameter may
be read by any code, not only its own module's forward (nn.MultiheadAttention reads
out_proj.weight without calling out_proj; TransformerEncoderLayer's eval fast path calls none
of its submodules; tied weights go through F.linear in a parent's forward), so waiting per
module cannot be made correct. Instead every synchronized parameter's class becomes a subclass
with a __torch_function__ (as nn.Parameter's own subclasses may have) while its pull is on its
way: every torch operation, method or attribute that reads a parameter's values passes through
it, and it waits for that parameter's pull first (beginning the step if it has not begun).
Metadata (shape, dtype, .grad, ...) does not wait. The overlap is kept: a parameter is waited for
when it is first read, not before. Once landed, a parameter has its own class back until the
next step's pull (pending()): so the cost is one Python call per operation that takes a
parameter not yet landed (bench/pytorch/compare.py measures the steps), and code that refuses
tensors with a __torch_function__ runs as without the guard once its parameters have landed.
Torch 1.13's TransformerEncoderLayer eval fast path is such code: it is refused while any of the
layer's parameters is still on its way ("some Tensor argument has_torch_function"; the layer
then runs its submodules, each read waiting here), and taken once all of them have landed (after
synchronize_parameters(), say), on the pulled values.

    entries = guard(params, owner)   # owner._gs_land(i) is called before parameter i is first read
    landed(params[i])                # parameter i holds this step's values: its own class back
    pending(entries)                 # after each step: the next step's values are on their way
    unguard(params, entries)         # after the last step: each parameter gets its class back
"""

import torch

_PENDING = {}  # id(parameter) -> (optimizer, index, parameter): guarded parameters not yet landed in this step

_METADATA = set()
for _name in ("grad", "shape", "dtype", "device", "requires_grad", "is_leaf", "grad_fn", "ndim", "is_sparse",
              "layout", "_version", "is_cuda", "names", "_backward_hooks"):
    if hasattr(torch.Tensor, _name):
        _METADATA.add(getattr(torch.Tensor, _name).__get__)
_METADATA.add(torch.Tensor.grad.__set__)
for _name in ("size", "dim", "numel", "data_ptr", "element_size", "is_contiguous", "nelement", "register_hook",
              "__repr__"):
    _METADATA.add(getattr(torch.Tensor, _name))
del _name


def _land(values):
    for a in values:
        if type(a) in (list, tuple):
            _land(a)
            continue
        entry = _PENDING.get(id(a))
        if entry is not None:
            entry[0]._gs_land(entry[1])


def _guarded_torch_function(cls, func, types, args=(), kwargs=None):
    if kwargs is None:
        kwargs = {}
    if _PENDING and func not in _METADATA:
        _land(args)
        if kwargs:
            _land(kwargs.values())
    with torch._C.DisableTorchFunction():
        return func(*args, **kwargs)


_guarded_classes = {}


def _guarded_class(cls):
    """A subclass of a parameter's class (nn.Parameter, or the user's own) with the guard."""
    if cls not in _guarded_classes:
        _guarded_classes[cls] = type(cls.__name__, (cls,), {
            "__torch_function__": classmethod(_guarded_torch_function),
            "_gs_unguarded": cls,
            "__module__": cls.__module__,
        })
    return _guarded_classes[cls]


def _wait_at_reads(p):
    if getattr(type(p), "_gs_unguarded", None) is None:
        p.__class__ = _guarded_class(type(p))


def guard(params, owner):
    """Guards `params`: the first read of params[i] (until landed(i)) calls owner._gs_land(i).
    Returns the entries to hand to pending() and unguard()."""
    entries = {}
    for i, p in enumerate(params):
        _wait_at_reads(p)
        entries[id(p)] = (owner, i, p)
    _PENDING.update(entries)
    return entries


def pending(entries):
    """Every guarded parameter waits again at its next read (a new step's pulls are on their way)."""
    for entry in entries.values():
        _wait_at_reads(entry[2])
    _PENDING.update(entries)


def landed(param):
    """`param` holds this step's values: reading it no longer waits, and it has its own class back."""
    _PENDING.pop(id(param), None)
    unguarded = getattr(type(param), "_gs_unguarded", None)
    if unguarded is not None:
        param.__class__ = unguarded


def unguard(params, entries):
    for key in entries:
        _PENDING.pop(key, None)
    for p in params:
        unguarded = getattr(type(p), "_gs_unguarded", None)
        if unguarded is not None:
            p.__class__ = unguarded
