"""The shards' optimizer state (PS modes) in torch's form and back: the native sync's
{"kind", "scalars": {"step"}, "tensor_steps": [each tensor's own steps, when some tensor skipped
steps], "slots": {name: [a flat float32 array per tensor]}} against torch.optim's
state_dict()["state"] ({index: {"momentum_buffer": tensor}}; Adam: "exp_avg", "exp_avg_sq",
"step"), for DistributedOptimizer.state_dict() / load_state_dict(). As in torch, a parameter that
never had a gradient has no entry, and each parameter's "step" is its own."""

import torch


def param_index(param_groups):
    """torch's state_dict numbers parameters in the order of their first appearance in the groups."""
    index = {}
    for g in param_groups:
        for p in g["params"]:
            index.setdefault(id(p), len(index))
    return index


def to_torch(native, params, kind, index):
    """The native state as torch's state_dict()["state"] ({} before the first step)."""
    state = {}
    if not native["slots"]:
        return state
    steps = native.get("tensor_steps") or [native["scalars"]["step"]] * len(params)
    for i, p in enumerate(params):
        if steps[i] == 0:
            continue  # never had a gradient: torch keeps no state for it
        entry = {name: torch.from_numpy(arrays[i].copy()).reshape(p.shape) for name, arrays in native["slots"].items()}
        if kind == "adam":
            entry["step"] = torch.tensor(float(steps[i]))
        state[index[id(p)]] = entry
    return state


def from_torch(saved, params, kind, index):
    """torch's state_dict()["state"] as the native state. A parameter without an entry (torch
    keeps none for one that never had a gradient) gets zeros and 0 steps of its own."""
    slots, scalars, tensor_steps = {}, {}, []
    entries = [saved.get(index[id(p)]) for p in params] if saved else []
    if any(e is not None for e in entries):
        first = next(e for e in entries if e is not None)
        for name in first:
            if name != "step":
                slots[name] = [e[name].detach().reshape(-1).to(torch.float32).numpy() if e is not None
                               else torch.zeros(p.numel()).numpy() for e, p in zip(entries, params)]
        if "step" in first:
            tensor_steps = [0 if e is None else int(float(e["step"])) for e in entries]
        else:
            tensor_steps = [0 if e is None else 1 for e in entries]  # SGD counts no steps: 1 means "has state"
        scalars["step"] = max(tensor_steps)
        if "step" not in first and all(e is not None for e in entries):
            del scalars["step"]
            tensor_steps = []
    native = dict(kind=kind, scalars=scalars, slots=slots)
    if tensor_steps and len(set(tensor_steps)) > 1:
        native["tensor_steps"] = tensor_steps
    return native
