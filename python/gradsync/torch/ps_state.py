"""The shards' optimizer state (PS modes) in torch's form and back: the native sync's
{"kind", "scalars": {"step"}, "slots": {name: [a flat float32 array per tensor]}} against
torch.optim's state_dict()["state"] ({index: {"momentum_buffer": tensor}}; Adam: "exp_avg",
"exp_avg_sq", "step"), for DistributedOptimizer.state_dict() / load_state_dict()."""

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
    for i, p in enumerate(params):
        entry = {name: torch.from_numpy(arrays[i].copy()).reshape(p.shape) for name, arrays in native["slots"].items()}
        if kind == "adam":
            entry["step"] = torch.tensor(float(native["scalars"]["step"]))
        state[index[id(p)]] = entry
    return state


def from_torch(saved, params, names, kind, index):
    """torch's state_dict()["state"] as the native state; ValueError when a parameter has none."""
    slots, scalars = {}, {}
    if saved:
        missing = [names[i] for i, p in enumerate(params) if index[id(p)] not in saved]
        if missing:
            raise ValueError("load_state_dict: no state for parameter '%s' (the shards keep every parameter's)"
                             % missing[0])
        first = saved[index[id(params[0])]]
        for name in first:
            if name != "step":
                slots[name] = [saved[index[id(p)]][name].detach().reshape(-1).to(torch.float32).numpy()
                               for p in params]
        if "step" in first:
            scalars["step"] = int(float(first["step"]))
    return dict(kind=kind, scalars=scalars, slots=slots)
